"""The COCO evaluator: model outputs in, the 24 TAO-named COCO metrics out.

Used by ``maskops evaluate``, by the trainer's periodic evaluation and by anything else
that has batches of (targets, outputs): ``reset()``, ``process()`` per batch, then
``evaluate()``. An evaluation split over processes (training's ranks) processes a disjoint
part of the images in each and hands its :meth:`COCOEvaluator.state` to one of them, which
loads them all (:meth:`COCOEvaluator.load`) and evaluates: the same metrics as one process
that processed every image, in any order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from maskops.data.labels import LabelMap
from maskops.evaluation.coco import (
    METRIC_PREFIX,
    Backend,
    CocoMetrics,
    IouType,
    load_ground_truth,
    metric_names,
)
from maskops.evaluation.errors import EvaluationError, GroundTruthError
from maskops.evaluation.postprocess import detections_to_coco
from maskops.evaluation.threads import map_single_threaded


class EvaluatorState(NamedTuple):
    """What an evaluator has processed: the image ids and their COCO results (plain
    lists, dicts, strings and numbers: small to pickle and send)."""

    image_ids: list[int]
    results: list[dict[str, Any]]


class COCOEvaluator:
    """Accumulates COCO results for processed images and computes COCO metrics.

    Args:
        gt_json_path: the COCO ground-truth file (``val_json_file``).
        label_map: maps the model's training labels to the dataset's category ids.
        iou_types: ``("bbox", "segm")``, or ``("bbox",)`` for a model without masks
            (``include_mask: false``): the ``mask_*`` metrics are then absent.
        score_threshold: detections scoring below this are not evaluated (0 keeps all,
            which is what COCO AP expects).
        backend: ``"faster"`` (faster-coco-eval) or ``"pycocotools"``.

    Only the images passed to :meth:`process` are evaluated (``eval_samples`` picks a
    subset), including those without detections.
    """

    def __init__(
        self,
        gt_json_path: str | Path,
        label_map: LabelMap,
        *,
        iou_types: Sequence[IouType] = ("bbox", "segm"),
        score_threshold: float = 0.0,
        backend: Backend = "faster",
    ) -> None:
        self.gt_json_path = Path(gt_json_path)
        self.label_map = label_map
        self.iou_types: tuple[IouType, ...] = tuple(iou_types)
        self.score_threshold = score_threshold
        self._metrics = CocoMetrics(load_ground_truth(self.gt_json_path), backend=backend)
        missing = [c.id for c in label_map.categories if c.id not in self._category_ids()]
        if missing:
            raise GroundTruthError(
                f"{self.gt_json_path}: the model's category ids {missing} are not in its categories"
            )
        self.results: list[dict[str, Any]] = []
        self.image_ids: list[int] = []

    def _category_ids(self) -> set[int]:
        return {int(c["id"]) for c in self._metrics.ground_truth["categories"]}

    @property
    def metric_names(self) -> list[str]:
        return metric_names(self.iou_types)

    def reset(self) -> None:
        self.results = []
        self.image_ids = []

    def process(
        self, inputs: Sequence[Mapping[str, Any]], outputs: Sequence[Mapping[str, torch.Tensor]]
    ) -> None:
        """Convert one batch of model outputs to COCO results and keep them.

        Args:
            inputs: per image, the data pipeline's target dict; only ``image_id`` (original
                id), ``scale`` (resize factor) and ``orig_size`` ``(h, w)`` are used.
            outputs: per image, the model's eval output (``boxes`` xyxy in the resized
                frame, ``labels``, ``scores``, optional ``masks`` ``[N, 1, M, M]``).
        """
        if len(inputs) != len(outputs):
            raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
        for target in inputs:
            image_id = int(target["image_id"])
            if image_id not in self._metrics.image_ids:
                raise GroundTruthError(
                    f"{self.gt_json_path}: image id {image_id} of the validation data is not "
                    "in the ground truth"
                )
        include_mask = "segm" in self.iou_types

        def convert(pair: tuple[Mapping[str, Any], Mapping[str, torch.Tensor]]) -> list[Any]:
            target, output = pair
            orig_h, orig_w = (int(v) for v in target["orig_size"])
            return detections_to_coco(
                output,
                image_id=int(target["image_id"]),
                scale=float(target["scale"]),
                orig_hw=(orig_h, orig_w),
                label_map=self.label_map,
                score_threshold=self.score_threshold,
                include_mask=include_mask,
            )

        converted = map_single_threaded(convert, zip(inputs, outputs, strict=True))
        for target, results in zip(inputs, converted, strict=True):
            self.image_ids.append(int(target["image_id"]))
            self.results.extend(results)

    def state(self) -> EvaluatorState:
        """What :meth:`process` has kept so far, for :meth:`load` in another process."""
        return EvaluatorState(list(self.image_ids), list(self.results))

    def load(self, states: Sequence[EvaluatorState]) -> None:
        """Replace what was processed by the union of ``states``: the states of
        evaluators (of the same ground truth) that processed disjoint sets of images.

        Raises:
            EvaluationError: an image is in two states (it would count twice).
        """
        self.reset()
        for image_ids, results in states:
            self.image_ids.extend(image_ids)
            self.results.extend(results)
        if len(set(self.image_ids)) != len(self.image_ids):
            twice = sorted(i for i, n in Counter(self.image_ids).items() if n > 1)
            raise EvaluationError(f"images evaluated more than once: ids {twice[:10]}")

    def evaluate(self) -> dict[str, float]:
        """COCO metrics over the processed images, keyed by :attr:`metric_names`.

        With ``include_mask`` off the dict has only the twelve box metrics. A value of -1
        is COCOeval's "no ground truth in this area range". The order images were processed
        in does not matter: results are evaluated in image id order, each image's in the
        model's order.
        """
        if not self.image_ids:
            raise EvaluationError("no images were evaluated (is the validation data empty?)")
        if "segm" in self.iou_types and any("segmentation" not in r for r in self.results):
            raise EvaluationError("mask metrics requested but the model output has no masks")
        # Stable: an image's detections keep their order, which decides COCOeval's ties.
        results = sorted(self.results, key=lambda r: int(r["image_id"]))
        return self._metrics.compute(
            results, image_ids=sorted(self.image_ids), iou_types=self.iou_types
        )

    def per_class(self) -> list[dict[str, Any]]:
        """Each ground-truth category's AP from the last :meth:`evaluate`, in id order:
        ``{"category_id", "name", "AP"}`` plus ``"mask_AP"`` with masks; -1 where the
        evaluated images hold no object of that category."""
        names = {int(c["id"]): str(c.get("name", c["id"])) for c in self._categories()}
        rows: dict[int, dict[str, Any]] = {
            i: {"category_id": i, "name": names[i]} for i in sorted(names)
        }
        for iou_type, values in self._metrics.per_category.items():
            for category_id, ap in values.items():
                rows[category_id][METRIC_PREFIX[iou_type] + "AP"] = ap
        return list(rows.values())

    def _categories(self) -> list[Mapping[str, Any]]:
        categories: list[Mapping[str, Any]] = self._metrics.ground_truth["categories"]
        return categories
