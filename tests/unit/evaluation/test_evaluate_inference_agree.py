"""``maskops evaluate`` and ``maskops inference`` see the same detections, bit for bit, on
photos whose size differs from the spec's ``image_size``; their mask metrics differ only by
the COCO protocol's choice of object area (mask area for mask AP, as torchvision's
references and detectron2 evaluate, versus the box area pycocotools takes when a result
carries a ``bbox``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from maskops.cli.main import main
from maskops.data.convert import convert_dataset
from maskops.data.demo import generate_demo_dataset
from maskops.data.pipeline import build_eval_loader
from maskops.evaluation import COCOEvaluator, evaluate_model
from maskops.evaluation.coco import metric_names
from maskops.evaluation.predictor import load_predictor
from maskops.spec import spec_to_text
from maskops.spec.models import ExperimentSpec

AREA_METRICS = ("APs", "APm", "APl", "ARs", "ARm", "ARl")


def _key(result: dict[str, Any]) -> tuple[Any, ...]:
    return (
        result["image_id"],
        result["score"],
        result["category_id"],
        tuple(result["bbox"]),
        result["segmentation"]["counts"],
        tuple(result["segmentation"]["size"]),
    )


def _pycocotools(gt_json: Path, results: list[dict[str, Any]], iou_type: str) -> list[float]:
    gt = COCO(str(gt_json))
    evaluator = COCOeval(gt, gt.loadRes(results), iou_type)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return [float(v) for v in evaluator.stats[:12]]


def test_evaluate_and_inference_agree_on_photos_of_another_size(
    tmp_path: Path, tiny_spec: ExperimentSpec, untrained_checkpoint: Path
) -> None:
    # 150x200 photos for a 128x128 model: resized by 0.64 and padded below.
    photos = generate_demo_dataset(
        tmp_path / "photos", num_images=10, image_size=(150, 200), seed=5, val_fraction=0.5
    )
    shards = tmp_path / "shards"
    convert_dataset(photos.val_images, photos.val_json, shards, workers=1)
    data = tiny_spec.data_config.model_copy(
        update={
            "validation_file_pattern": f"{shards}/val*",
            "val_json_file": str(photos.val_json),
            "eval_samples": 0,
        }
    )
    # Batches of 3 over 5 images: evaluate (shard order) and inference (name order) put
    # the images in different batches, which must not change any image's detections.
    spec = tiny_spec.model_copy(update={"data_config": data, "eval_batch_size": 3})

    loaded = load_predictor(untrained_checkpoint)
    evaluator = COCOEvaluator(photos.val_json, loaded.label_map)
    loader = build_eval_loader(spec, label_map=loaded.label_map, with_masks=False)
    metrics = evaluate_model(loaded.predictor, loader, evaluator, progress=False)

    spec_file = tmp_path / "spec.txt"
    spec_file.write_text(spec_to_text(spec))
    out = tmp_path / "inference"
    args = ["inference", "-i", str(photos.val_images), "-e", str(spec_file)]
    assert main([*args, "-m", str(untrained_checkpoint), "-r", str(out), "-t", "0.0"]) == 0
    inferred = [
        r
        for f in sorted((out / "labels").glob("*.json"))
        if f.name != "coco_images.json"
        for r in json.loads(f.read_text())
    ]

    assert evaluator.results, "the model detected nothing: the comparison would be vacuous"
    assert sorted(map(_key, inferred)) == sorted(map(_key, evaluator.results))
    assert {tuple(r["segmentation"]["size"]) for r in inferred} == {(150, 200)}

    names = metric_names(["segm"])
    masks_only = [{k: v for k, v in r.items() if k != "bbox"} for r in inferred]
    reference = dict(zip(names, _pycocotools(photos.val_json, masks_only, "segm"), strict=True))
    assert reference == {name: metrics[name] for name in names}
    # With the box kept, pycocotools files each detection under its box's area: only the
    # small/medium/large metrics can move.
    with_boxes = dict(zip(names, _pycocotools(photos.val_json, inferred, "segm"), strict=True))
    assert {k: v for k, v in with_boxes.items() if k[5:] not in AREA_METRICS} == {
        k: v for k, v in reference.items() if k[5:] not in AREA_METRICS
    }
