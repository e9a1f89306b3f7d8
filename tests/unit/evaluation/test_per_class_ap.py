"""Per-category AP in the evaluation report equals pycocotools evaluating that category."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from maskops.data.labels import LabelMap
from maskops.evaluation.coco import CocoMetrics
from maskops.evaluation.evaluator import COCOEvaluator
from tests.unit.evaluation.crafted import CATEGORY_IDS, make_ground_truth, noisy_results


def _pycocotools_category_ap(
    gt: dict[str, Any], results: list[dict[str, Any]], iou_type: str, category_id: int
) -> float:
    """COCOeval restricted to one category: its summary AP."""
    key = "bbox" if iou_type == "bbox" else "segmentation"
    dts = [
        {k: copy.deepcopy(r[k]) for k in ("image_id", "category_id", "score", key)} for r in results
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = copy.deepcopy(gt)
        coco_gt.createIndex()
        evaluator = COCOeval(coco_gt, coco_gt.loadRes(dts), iou_type)
        evaluator.params.catIds = [category_id]
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return float(evaluator.stats[0])


@pytest.mark.parametrize("backend", ["faster", "pycocotools"])
@pytest.mark.parametrize("seed", [0, 1])
def test_per_category_ap_equals_pycocotools(backend: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    gt = make_ground_truth(rng, num_images=8)
    results = noisy_results(gt, rng, skip_images=2)
    metrics = CocoMetrics(gt, backend=backend)
    metrics.compute(results)
    for iou_type in ("bbox", "segm"):
        ours = metrics.per_category[iou_type]
        assert sorted(ours) == sorted(CATEGORY_IDS)
        for category_id in CATEGORY_IDS:
            reference = _pycocotools_category_ap(gt, results, iou_type, category_id)
            assert ours[category_id] == pytest.approx(reference, abs=1e-6)
        # Categories differ: the table is not one number repeated.
        assert len({round(v, 6) for v in ours.values()}) > 1


def test_evaluator_reports_names_ids_and_absent_categories(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    gt = make_ground_truth(rng, num_images=4)
    # A category with no object anywhere reports -1 (COCOeval's "undefined").
    gt["categories"].append({"id": 99, "name": "unicorn"})
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(gt))
    labels = LabelMap.from_coco_categories(gt["categories"])
    evaluator = COCOEvaluator(path, labels, iou_types=("bbox",))
    image = gt["images"][0]
    # One detection exactly on the first object of the first image.
    ann = next(a for a in gt["annotations"] if a["image_id"] == image["id"])
    x, y, w, h = ann["bbox"]
    evaluator.process(
        [{"image_id": image["id"], "scale": 1.0, "orig_size": (image["height"], image["width"])}],
        [
            {
                "boxes": torch.tensor([[x, y, x + w, y + h]]),
                "labels": torch.tensor([labels.label_of(ann["category_id"])]),
                "scores": torch.tensor([0.9]),
            }
        ],
    )
    evaluator.evaluate()
    rows = evaluator.per_class()
    assert [r["category_id"] for r in rows] == sorted([*CATEGORY_IDS, 99])
    by_id = {r["category_id"]: r for r in rows}
    assert by_id[99] == {"category_id": 99, "name": "unicorn", "AP": -1.0}
    assert by_id[ann["category_id"]]["AP"] > 0
    assert all("mask_AP" not in r for r in rows)
