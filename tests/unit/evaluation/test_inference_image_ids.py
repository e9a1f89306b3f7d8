"""Inference results carry the dataset's image ids, so they score like ``maskops evaluate``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from maskops.cli.main import main
from maskops.evaluation.inference import assign_image_ids, name_image_id
from maskops.spec import spec_to_text
from maskops.spec.models import ExperimentSpec


def test_ids_do_not_depend_on_the_other_files() -> None:
    names = [Path(n) for n in ("b.jpg", "17.jpg", "a.png")]
    ids = assign_image_ids(names)
    assert ids[1] == 17  # COCO-style numeric names keep their number
    more = assign_image_ids([Path("0.jpg"), *names, Path("c.jpg")])
    assert more[1:4] == ids  # one more file changes no other image's id
    # A listed image takes the annotation file's id; a numeric name that collides with a
    # listed id falls back to the name's hash instead of duplicating the id.
    known = assign_image_ids([Path("17.jpg"), Path("5.jpg")], {"5.jpg": 17})
    assert known[1] == 17 and known[0] not in (17, name_image_id("17.jpg"))
    assert known == assign_image_ids([Path("17.jpg"), Path("5.jpg")], {"5.jpg": 17})


def _renamed_copy(demo: Any, out: Path) -> tuple[Path, dict[str, Any]]:
    """The demo val images renamed so that every numeric name is *another* image's id
    (file ``26.jpg`` is image 25, ...), and the val JSON with those file names."""
    coco = json.loads(Path(demo.val_json).read_text())
    images = sorted(coco["images"], key=lambda image: image["id"])
    out.mkdir()
    for image, other in zip(images, images[1:] + images[:1], strict=True):
        new_name = f"{other['id']}.jpg"
        shutil.copy(Path(demo.val_images) / image["file_name"], out / new_name)
        image["file_name"] = new_name
    return out, coco


def _spec(path: Path, spec: ExperimentSpec, val_json: Path) -> Path:
    data = spec.data_config.model_copy(
        update={"val_json_file": str(val_json), "validation_file_pattern": "", "eval_samples": 0}
    )
    # One image per batch: evaluate (JSON order) and inference (name order) batch the
    # images differently, and a batch of one computes each exactly alike.
    path.write_text(
        spec_to_text(spec.model_copy(update={"data_config": data, "eval_batch_size": 1}))
    )
    return path


def _infer(
    spec: Path, model: Path, images: Path, results: Path, *extra: str
) -> list[dict[str, Any]]:
    args = ["inference", "-i", str(images), "-e", str(spec), "-m", str(model)]
    assert main([*args, "-r", str(results), "-t", "0.0", *extra]) == 0
    labels = sorted((results / "labels").glob("*.json"))
    return [r for f in labels if f.name != "coco_images.json" for r in json.loads(f.read_text())]


def _ground_truth_from(results: list[dict[str, Any]], coco: dict[str, Any]) -> dict[str, Any]:
    """A COCO file whose objects are each image's three best detections: a model then
    scores well on it exactly when its results are filed under the right image ids."""
    annotations: list[dict[str, Any]] = []
    for image in coco["images"]:
        mine = [r for r in results if r["image_id"] == image["id"]]
        for r in sorted(mine, key=lambda r: -r["score"])[:3]:
            w, h = r["bbox"][2:]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image["id"],
                    "category_id": r["category_id"],
                    "bbox": r["bbox"],
                    "area": w * h,
                    "iscrowd": 0,
                    "segmentation": r["segmentation"],
                }
            )
    return {**coco, "annotations": annotations}


def _coco_ap(ground_truth: Path, results: list[dict[str, Any]], iou_type: str) -> float:
    gt = COCO(str(ground_truth))
    evaluator = COCOeval(gt, gt.loadRes(results), iou_type)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return float(evaluator.stats[0])


def test_inference_scores_like_evaluate(
    tmp_path: Path, demo_dataset: Any, tiny_spec: ExperimentSpec, untrained_checkpoint: Path
) -> None:
    images, coco = _renamed_copy(demo_dataset, tmp_path / "images")
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(coco))
    spec = _spec(tmp_path / "spec.txt", tiny_spec, renamed)
    (tmp_path / "classes.txt").write_text("round\nbox\n")
    first = _infer(
        spec, untrained_checkpoint, images, tmp_path / "first", "-c", str(tmp_path / "classes.txt")
    )

    by_name = {image["file_name"]: image["id"] for image in coco["images"]}
    assert first and all(r["image_id"] == by_name[r["file_name"]] for r in first)
    index = json.loads((tmp_path / "first" / "labels" / "coco_images.json").read_text())
    assert {c["id"]: c["name"] for c in index["categories"]} == {
        1: "round",
        3: "box",
        7: "triangle",
    }

    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(_ground_truth_from(first, coco)))
    # --annotations names the id source explicitly (the spec's val_json_file is another file).
    results = _infer(
        spec, untrained_checkpoint, images, tmp_path / "second", "--annotations", str(truth)
    )
    evaluate_args = ["evaluate", "-e", str(_spec(tmp_path / "truth_spec.txt", tiny_spec, truth))]
    code = main(
        [
            *evaluate_args,
            "-m",
            str(untrained_checkpoint),
            "-i",
            str(images),
            "-r",
            str(tmp_path / "eval"),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "eval" / "evaluation.json").read_text())
    metrics = report["metrics"]
    assert [(r["category_id"], r["name"]) for r in report["per_class"]] == [
        (1, "circle"),
        (3, "square"),
        (7, "triangle"),
    ]
    assert "Per-class AP" in (tmp_path / "eval" / "evaluate.log").read_text()

    assert metrics["AP"] > 0.5  # the model's own detections: scored under the right ids
    assert _coco_ap(truth, results, "bbox") == pytest.approx(metrics["AP"], abs=1e-9)
    assert _coco_ap(truth, results, "segm") == pytest.approx(metrics["mask_AP"], abs=1e-9)
