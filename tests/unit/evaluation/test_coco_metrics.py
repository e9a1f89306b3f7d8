"""COCO metrics: faster-coco-eval against pycocotools, and known answers."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from maskops.evaluation.coco import (
    METRIC_NAMES,
    Backend,
    CocoMetrics,
    load_ground_truth,
    metric_names,
)
from maskops.evaluation.errors import GroundTruthError
from tests.unit.evaluation.crafted import make_ground_truth, noisy_results, perfect_results


def _pycocotools_stats(gt: dict, results: list[dict], iou_type: str, img_ids=None) -> list[float]:
    """Plain pycocotools, the way its README runs it (results without the other type)."""
    coco_gt = COCO()
    coco_gt.dataset = copy.deepcopy(gt)
    coco_gt.createIndex()
    drop = "segmentation" if iou_type == "bbox" else "bbox"
    dts = [{k: copy.deepcopy(v) for k, v in r.items() if k != drop} for r in results]
    evaluator = COCOeval(coco_gt, coco_gt.loadRes(dts), iou_type)
    if img_ids is not None:
        evaluator.params.imgIds = img_ids
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return [float(v) for v in evaluator.stats[:12]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_faster_backend_equals_pycocotools(seed: int) -> None:
    rng = np.random.default_rng(seed)
    gt = make_ground_truth(rng, num_images=8)  # crowd RLEs, non-contiguous ids
    results = noisy_results(gt, rng, skip_images=2)  # two images without detections
    metrics = CocoMetrics(gt).compute(results)
    assert list(metrics) == metric_names(["bbox", "segm"])
    for iou_type, prefix in (("bbox", ""), ("segm", "mask_")):
        reference = _pycocotools_stats(gt, results, iou_type)
        ours = [metrics[prefix + name] for name in METRIC_NAMES]
        np.testing.assert_allclose(ours, reference, atol=1e-6, rtol=0)
    # Noisy detections are neither worthless nor perfect.
    assert 0.0 < metrics["AP"] < 1.0 and 0.0 < metrics["mask_AP"] < 1.0
    # The reference backend is pycocotools itself.
    np.testing.assert_allclose(
        list(CocoMetrics(gt, backend="pycocotools").compute(results).values()),
        list(metrics.values()),
        atol=1e-6,
        rtol=0,
    )


def test_perfect_predictions_give_ap_one() -> None:
    gt = make_ground_truth(np.random.default_rng(3), num_images=5)
    metrics = CocoMetrics(gt).compute(perfect_results(gt))
    for prefix in ("", "mask_"):
        for name in ("AP", "AP50", "AP75", "ARmax100"):
            assert metrics[prefix + name] == pytest.approx(1.0, abs=1e-12)


def test_shifted_boxes_lose_precision_at_strict_iou() -> None:
    gt = make_ground_truth(np.random.default_rng(4), num_images=5, with_crowd=False)
    perfect = perfect_results(gt)
    shifted = copy.deepcopy(perfect)
    for r in shifted:
        x, y, w, h = r["bbox"]
        r["bbox"] = [x + 0.2 * w, y, w, h]  # IoU 0.8/1.2 = 0.667 with its ground truth
    metrics = CocoMetrics(gt).compute(shifted, iou_types=("bbox",))
    assert metrics["AP50"] == pytest.approx(1.0)
    assert metrics["AP75"] == pytest.approx(0.0)
    # AP averages over IoU thresholds 0.50:0.05:0.95; the shifted boxes pass 0.50..0.65.
    assert metrics["AP"] == pytest.approx(np.mean(np.linspace(0.5, 0.95, 10) <= 2 / 3))
    np.testing.assert_allclose(
        [metrics[n] for n in METRIC_NAMES], _pycocotools_stats(gt, shifted, "bbox"), atol=1e-6
    )


def test_crowd_ground_truth_is_ignored_not_missed() -> None:
    gt = make_ground_truth(np.random.default_rng(5), num_images=4, with_crowd=True)
    assert any(a["iscrowd"] for a in gt["annotations"])
    # A detection exactly on a crowd region is neither a true nor a false positive.
    crowd_hits = [
        {
            "image_id": a["image_id"],
            "category_id": a["category_id"],
            "bbox": a["bbox"],
            "score": 0.99,
        }
        for a in gt["annotations"]
        if a["iscrowd"]
    ]
    perfect = perfect_results(gt)
    with_crowd_hits = CocoMetrics(gt).compute(perfect + crowd_hits, iou_types=("bbox",))
    assert with_crowd_hits["AP"] == pytest.approx(1.0)


def test_subset_of_images_and_no_detections() -> None:
    rng = np.random.default_rng(6)
    gt = make_ground_truth(rng, num_images=6)
    results = noisy_results(gt, rng, skip_images=0)
    subset = [img["id"] for img in gt["images"][:3]]
    kept = [r for r in results if r["image_id"] in subset]
    metrics = CocoMetrics(gt).compute(kept, image_ids=subset, iou_types=("bbox",))
    np.testing.assert_allclose(
        [metrics[n] for n in METRIC_NAMES], _pycocotools_stats(gt, kept, "bbox", subset), atol=1e-6
    )
    empty = CocoMetrics(gt).compute([], image_ids=subset)
    assert all(v in (0.0, -1.0) for v in empty.values())
    assert empty == CocoMetrics(gt, backend="pycocotools").compute([], image_ids=subset)


def test_bbox_only_reports_twelve_metrics_and_unknown_images_fail() -> None:
    gt = make_ground_truth(np.random.default_rng(7), num_images=3)
    metrics = CocoMetrics(gt).compute(perfect_results(gt), iou_types=("bbox",))
    assert list(metrics) == list(METRIC_NAMES)
    with pytest.raises(GroundTruthError, match=r"not in the ground truth: \[999999\]"):
        CocoMetrics(gt).compute(
            [{"image_id": 999999, "category_id": 3, "bbox": [0, 0, 1, 1], "score": 1.0}],
            iou_types=("bbox",),
        )


def test_load_ground_truth_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(GroundTruthError, match=r"nope.json: ground-truth file not found"):
        load_ground_truth(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(GroundTruthError, match=r"broken.json: not a readable COCO JSON"):
        load_ground_truth(broken)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"images": [], "annotations": []}))
    with pytest.raises(GroundTruthError, match=r"partial.json: missing or invalid 'categories'"):
        load_ground_truth(partial)


@pytest.mark.parametrize("backend", ["faster", "pycocotools"])
@pytest.mark.parametrize("ids", ["duplicate", "zero"])
def test_annotation_ids_do_not_change_the_metrics(backend: Backend, ids: str) -> None:
    """COCOeval keys ground truth by annotation id and marks unmatched ones with 0: ids a
    file repeats (or an id 0) must not turn perfect detections into misses."""
    gt = make_ground_truth(np.random.default_rng(8), num_images=4)
    for k, ann in enumerate(gt["annotations"]):
        ann["id"] = 7 if ids == "duplicate" else k
    metrics = CocoMetrics(gt, backend=backend).compute(perfect_results(gt))
    for prefix in ("", "mask_"):
        assert metrics[prefix + "AP"] == pytest.approx(1.0, abs=1e-12)
        assert metrics[prefix + "ARmax100"] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"images": [5], "annotations": [], "categories": []}, r"images\[0\]: expected an object"),
        (
            {"images": [["id"]], "annotations": [], "categories": []},
            r"images\[0\]: expected an object",
        ),
        (
            {"images": [{"id": 1, "height": 4}], "annotations": [], "categories": []},
            r"images\[0\] \(id 1\) lacks id/height/width",
        ),
        (
            {"images": [], "annotations": ["x"], "categories": []},
            r"annotations\[0\]: expected an object",
        ),
        (
            {"images": [], "annotations": [{"id": 1, "image_id": 1}], "categories": []},
            r"annotations\[0\] \(id 1\) lacks image_id/category_id",
        ),
        ({"images": [], "annotations": [], "categories": [3]}, r"categories\[0\]: expected"),
    ],
)
def test_malformed_ground_truth_entries_name_file_and_index(
    tmp_path: Path, document: dict, message: str
) -> None:
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(document))
    with pytest.raises(GroundTruthError, match=r"gt\.json: " + message):
        load_ground_truth(path)
