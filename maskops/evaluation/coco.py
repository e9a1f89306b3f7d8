"""COCO metrics under TAO's names, computed with faster-coco-eval or pycocotools.

Both libraries implement the same COCOeval; faster-coco-eval does the per-image matching
and accumulation in C++ and is the default. The tests hold it to pycocotools on crafted and
random detections (identical to 1e-6); ``backend="pycocotools"`` is the reference.

Box AP uses ``bbox`` results; mask AP uses ``segmentation`` results *without* their boxes,
so that COCOeval takes each detection's area from its mask (with a box present, loadRes
would use the box area for the small/medium/large split; torchvision's references and
detectron2 evaluate masks this way too).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from maskops.evaluation.errors import GroundTruthError

IouType = Literal["bbox", "segm"]
Backend = Literal["faster", "pycocotools"]

METRIC_NAMES: tuple[str, ...] = (
    "AP",
    "AP50",
    "AP75",
    "APs",
    "APm",
    "APl",
    "ARmax1",
    "ARmax10",
    "ARmax100",
    "ARs",
    "ARm",
    "ARl",
)
"""TAO's names of COCOeval's twelve summary numbers, in ``COCOeval.stats`` order."""

METRIC_PREFIX: dict[str, str] = {"bbox": "", "segm": "mask_"}
"""Box metrics are unprefixed (``AP``); mask metrics are ``mask_AP`` and so on."""


def metric_names(iou_types: Iterable[str]) -> list[str]:
    """The metric keys an evaluation over ``iou_types`` reports, in report order."""
    return [METRIC_PREFIX[t] + name for t in iou_types for name in METRIC_NAMES]


def load_ground_truth(path: str | Path) -> dict[str, Any]:
    """Read a COCO annotation file, checking the parts evaluation relies on.

    Raises:
        GroundTruthError: unreadable JSON or missing ``images``/``annotations``/``categories``.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise GroundTruthError(f"{path}: ground-truth file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GroundTruthError(f"{path}: not a readable COCO JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise GroundTruthError(f"{path}: expected a COCO object, got {type(data).__name__}")
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise GroundTruthError(f"{path}: missing or invalid '{key}' list")
    required = {
        "images": ("id", "height", "width"),
        "annotations": ("image_id", "category_id"),
        "categories": ("id",),
    }
    for key, keys in required.items():
        for index, entry in enumerate(data[key]):
            if not isinstance(entry, dict):
                raise GroundTruthError(
                    f"{path}: {key}[{index}]: expected an object, got {type(entry).__name__}"
                )
            if not all(k in entry for k in keys):
                raise GroundTruthError(
                    f"{path}: {key}[{index}] (id {entry.get('id')!r}) lacks {'/'.join(keys)}"
                )
    return data


def _evaluation_copy(gt: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``gt`` for COCOeval, its annotations numbered 1, 2, ...

    COCOeval indexes ground truth by annotation id and marks an unmatched one with id 0,
    so a file's repeated ids (or an id 0) would silently turn matches into misses; the
    ids mean nothing else to the metrics.
    """
    data = copy.deepcopy(dict(gt))
    data["annotations"] = [
        {**ann, "id": number} for number, ann in enumerate(data["annotations"], start=1)
    ]
    return data


CategoryAP = dict[int, float]
"""Category id -> AP (COCO's primary metric, IoU 0.50:0.95) of that category alone; -1 where
the evaluated images hold no ground truth of it."""


def per_category_ap(precision: np.ndarray, category_ids: Sequence[int]) -> CategoryAP:
    """Each category's AP from COCOeval's accumulated ``eval["precision"]``.

    Args:
        precision: ``[T, R, K, A, M]`` precisions (IoU thresholds, recall points,
            categories, area ranges, max-detection settings); -1 where undefined.
        category_ids: the K category ids, in ``params.catIds`` order.

    Returns:
        The mean over thresholds and recall points at area "all" (index 0) and the largest
        max-detections (100), as COCOeval's summary AP averages over all categories.
    """
    out: CategoryAP = {}
    for k, category_id in enumerate(category_ids):
        values = precision[:, :, k, 0, -1]
        values = values[values > -1]
        out[int(category_id)] = float(values.mean()) if values.size else -1.0
    return out


def _results_for(results: Sequence[Mapping[str, Any]], iou_type: str) -> list[dict[str, Any]]:
    """Fresh per-type result dicts (loadRes mutates what it is given)."""
    key = "bbox" if iou_type == "bbox" else "segmentation"
    return [
        {
            "image_id": r["image_id"],
            "category_id": r["category_id"],
            "score": r["score"],
            key: list(r[key]) if key == "bbox" else dict(r[key]),
        }
        for r in results
        if key in r
    ]


def _summary_pycocotools(
    gt: Mapping[str, Any], dts: list[dict[str, Any]], iou_type: str, image_ids: list[int]
) -> tuple[np.ndarray, CategoryAP]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = _evaluation_copy(gt)
        coco_gt.createIndex()
        # pycocotools' loadRes cannot take an empty list; an empty result set is an
        # empty annotation list over the same images and categories.
        if dts:
            coco_dt = coco_gt.loadRes(dts)
        else:
            coco_dt = COCO()
            coco_dt.dataset = {
                "images": list(coco_gt.dataset["images"]),
                "categories": copy.deepcopy(coco_gt.dataset["categories"]),
                "annotations": [],
            }
            coco_dt.createIndex()
        evaluator = COCOeval(coco_gt, coco_dt, iou_type)
        evaluator.params.imgIds = image_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = np.asarray(evaluator.stats[:12], dtype=np.float64)
    return stats, per_category_ap(evaluator.eval["precision"], evaluator.params.catIds)


class _FasterGroundTruth:
    """A faster-coco-eval ground truth kept across evaluations (it caches mask RLEs)."""

    def __init__(self, gt: Mapping[str, Any]) -> None:
        from faster_coco_eval import COCO

        self.coco = COCO(_evaluation_copy(gt))

    def summary(
        self, dts: list[dict[str, Any]], iou_type: str, image_ids: list[int]
    ) -> tuple[np.ndarray, CategoryAP]:
        from faster_coco_eval import COCOeval_faster

        coco_dt = self.coco.loadRes(dts)
        evaluator = COCOeval_faster(
            self.coco, coco_dt, iou_type, print_function=lambda *args, **kwargs: None
        )
        evaluator.params.imgIds = image_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
        stats = np.asarray(evaluator.stats[:12], dtype=np.float64)
        precision = np.asarray(evaluator.eval["precision"])
        return stats, per_category_ap(precision, evaluator.params.catIds)


class CocoMetrics:
    """COCO summary metrics of result lists against one ground truth.

    Args:
        ground_truth: a COCO annotation dict (as :func:`load_ground_truth` returns).
        backend: ``"faster"`` (faster-coco-eval, default) or ``"pycocotools"`` (reference).
    """

    def __init__(self, ground_truth: Mapping[str, Any], *, backend: Backend = "faster") -> None:
        if backend not in ("faster", "pycocotools"):
            raise ValueError(f"unknown COCO evaluation backend {backend!r}")
        self.ground_truth = ground_truth
        self.backend = backend
        self.image_ids: frozenset[int] = frozenset(int(i["id"]) for i in ground_truth["images"])
        self._faster: _FasterGroundTruth | None = None
        self.per_category: dict[str, CategoryAP] = {}
        """Set by :meth:`compute`: IoU type -> each ground-truth category's AP."""

    def compute(
        self,
        results: Sequence[Mapping[str, Any]],
        *,
        image_ids: Iterable[int] | None = None,
        iou_types: Sequence[IouType] = ("bbox", "segm"),
    ) -> dict[str, float]:
        """Evaluate COCO results (original image and category ids).

        Args:
            results: dicts with ``image_id``, ``category_id``, ``score``, ``bbox``
                ``[x, y, w, h]`` and (for ``segm``) ``segmentation`` as compressed RLE.
            image_ids: the images evaluated (also those without detections); ``None`` =
                every image of the ground truth.
            iou_types: ``"bbox"`` and/or ``"segm"``.

        Returns:
            ``{name: value}`` for :func:`metric_names` of ``iou_types``; COCOeval's -1
            ("no ground truth in this area range") is kept as -1. Each category's AP is
            left in :attr:`per_category`.
        """
        ids = sorted(self.image_ids if image_ids is None else {int(i) for i in image_ids})
        unknown = sorted({int(r["image_id"]) for r in results} - self.image_ids)
        if unknown:
            raise GroundTruthError(f"results for image ids not in the ground truth: {unknown[:10]}")
        metrics: dict[str, float] = {}
        self.per_category = {}
        for iou_type in iou_types:
            if iou_type not in METRIC_PREFIX:
                raise ValueError(f"unknown IoU type {iou_type!r} (expected bbox or segm)")
            dts = _results_for(results, iou_type)
            if iou_type == "segm" and len(dts) != len(results):
                raise ValueError("segm evaluation needs a segmentation in every result")
            if self.backend == "faster":
                if self._faster is None:
                    self._faster = _FasterGroundTruth(self.ground_truth)
                stats, per_category = self._faster.summary(dts, iou_type, ids)
            else:
                stats, per_category = _summary_pycocotools(self.ground_truth, dts, iou_type, ids)
            self.per_category[iou_type] = per_category
            prefix = METRIC_PREFIX[iou_type]
            metrics.update(
                {prefix + name: float(v) for name, v in zip(METRIC_NAMES, stats, strict=True)}
            )
        return metrics
