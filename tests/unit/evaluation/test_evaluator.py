"""COCOEvaluator on crafted model outputs: frames, ids, subsets, masks, loadRes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from maskops.data.labels import LabelMap
from maskops.evaluation import COCOEvaluator, GroundTruthError, evaluate_model, metric_names
from tests.unit.evaluation.crafted import make_ground_truth


def _write(tmp_path: Path, gt: dict) -> Path:
    path = tmp_path / "val.json"
    path.write_text(json.dumps(gt))
    return path


def _model_outputs(gt: dict, label_map: LabelMap, scale: float, rng: np.random.Generator):
    """What a model would output for each GT image resized by ``scale``: every non-crowd
    instance, boxes jittered by up to 2 px in the resized frame, box-filling masks."""
    batches = []
    for image in gt["images"]:
        anns = [a for a in gt["annotations"] if a["image_id"] == image["id"] and not a["iscrowd"]]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        boxes = boxes * scale + torch.from_numpy(rng.uniform(-2, 2, boxes.shape)).float()
        target = {
            "image_id": image["id"],
            "scale": scale,
            "orig_size": (image["height"], image["width"]),
        }
        output = {
            "boxes": boxes,
            "labels": torch.tensor([label_map.label_of(a["category_id"]) for a in anns]),
            "scores": torch.from_numpy(rng.uniform(0.3, 1.0, len(anns))).float(),
            "masks": torch.from_numpy(rng.uniform(0.4, 1.0, (len(anns), 1, 28, 28))).float(),
        }
        batches.append((target, output))
    return batches


def test_evaluator_matches_pycocotools_on_its_own_results(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    gt = make_ground_truth(rng, num_images=7)
    label_map = LabelMap.from_coco_categories(gt["categories"])  # ids 3, 17, 90 -> 1, 2, 3
    evaluator = COCOEvaluator(_write(tmp_path, gt), label_map)
    pairs = _model_outputs(gt, label_map, 1.6, rng)
    # Batches of 3; the second image has its detections removed.
    pairs[1] = (pairs[1][0], {k: v[:0] for k, v in pairs[1][1].items()})
    for start in range(0, len(pairs), 3):
        chunk = pairs[start : start + 3]
        evaluator.process([t for t, _ in chunk], [o for _, o in chunk])
    metrics = evaluator.evaluate()

    assert list(metrics) == metric_names(["bbox", "segm"])
    assert {r["category_id"] for r in evaluator.results} <= {3, 17, 90}
    assert 0.3 < metrics["AP50"] <= 1.0
    coco_gt = COCO(str(tmp_path / "val.json"))
    for iou_type, prefix, drop in (("bbox", "", "segmentation"), ("segm", "mask_", "bbox")):
        dts = [{k: copy.deepcopy(v) for k, v in r.items() if k != drop} for r in evaluator.results]
        reference = COCOeval(coco_gt, coco_gt.loadRes(dts), iou_type)
        reference.evaluate()
        reference.accumulate()
        reference.summarize()
        np.testing.assert_allclose(
            [metrics[prefix + n] for n in metric_names(["bbox"])], reference.stats[:12], atol=1e-6
        )


def test_subset_reset_and_bbox_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    gt = make_ground_truth(rng, num_images=6)
    label_map = LabelMap.from_coco_categories(gt["categories"])
    evaluator = COCOEvaluator(_write(tmp_path, gt), label_map, iou_types=("bbox",))
    pairs = _model_outputs(gt, label_map, 0.5, rng)
    evaluator.process([pairs[0][0]], [pairs[0][1]])
    evaluator.reset()
    evaluator.process([t for t, _ in pairs[:2]], [o for _, o in pairs[:2]])  # eval_samples=2
    metrics = evaluator.evaluate()
    assert list(metrics) == metric_names(["bbox"])
    assert evaluator.image_ids == [gt["images"][0]["id"], gt["images"][1]["id"]]
    assert all("segmentation" not in r for r in evaluator.results)

    coco_gt = COCO(str(tmp_path / "val.json"))
    reference = COCOeval(coco_gt, coco_gt.loadRes(copy.deepcopy(evaluator.results)), "bbox")
    reference.params.imgIds = evaluator.image_ids
    reference.evaluate()
    reference.accumulate()
    reference.summarize()
    np.testing.assert_allclose(list(metrics.values()), reference.stats[:12], atol=1e-6)


def test_evaluate_model_runs_any_predictor_and_respects_max_images(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    gt = make_ground_truth(rng, num_images=5)
    label_map = LabelMap.from_coco_categories(gt["categories"])
    pairs = _model_outputs(gt, label_map, 1.0, rng)
    by_id = {t["image_id"]: o for t, o in pairs}

    def predictor(images):  # stands in for a model: looks the answer up by image
        return [by_id[int(img[0, 0, 0])] for img in images]

    loader = [
        (
            [torch.full((3, 8, 8), float(t["image_id"])) for t, _ in pairs[i : i + 2]],
            [t for t, _ in pairs[i : i + 2]],
        )
        for i in range(0, len(pairs), 2)
    ]
    evaluator = COCOEvaluator(_write(tmp_path, gt), label_map)
    evaluate_model(predictor, loader, evaluator, max_images=3)
    assert evaluator.image_ids == [t["image_id"] for t, _ in pairs[:3]]


def test_clear_errors_for_unusable_inputs(tmp_path: Path) -> None:
    gt = make_ground_truth(np.random.default_rng(3), num_images=2)
    path = _write(tmp_path, gt)
    other = LabelMap.from_coco_categories([{"id": 3, "name": "a"}, {"id": 55, "name": "z"}])
    with pytest.raises(GroundTruthError, match=r"category ids \[55\] are not in"):
        COCOEvaluator(path, other)
    evaluator = COCOEvaluator(path, LabelMap.from_coco_categories(gt["categories"]))
    with pytest.raises(GroundTruthError, match=r"image id 123456 of the validation data"):
        evaluator.process(
            [{"image_id": 123456, "scale": 1.0, "orig_size": (10, 10)}],
            [
                {
                    "boxes": torch.zeros(0, 4),
                    "labels": torch.zeros(0, dtype=torch.int64),
                    "scores": torch.zeros(0),
                }
            ],
        )
    with pytest.raises(ValueError, match=r"no images were evaluated"):
        evaluator.evaluate()


def test_fixed_size_predictors_are_checked_against_the_spec(tmp_path: Path) -> None:
    from maskops.evaluation.errors import EvaluationError
    from maskops.evaluation.predictor import LoadedPredictor, check_input_size
    from maskops.spec.models import ExperimentSpec

    class Exported:
        image_size = (256, 384)

        def __call__(self, images):
            return []

    loaded = LoadedPredictor(
        predictor=Exported(),
        spec=ExperimentSpec(),
        label_map=LabelMap.from_coco_categories([{"id": 1, "name": "a"}]),
        source=tmp_path / "model.onnx",
    )
    check_input_size(loaded, (256, 384))
    with pytest.raises(EvaluationError, match=r"model.onnx: takes images of \(256, 384\)"):
        check_input_size(loaded, (832, 1344))
