"""Predictions exported for review: COCO (polygons and RLE), CVAT XML and Label Studio
pre-annotations, from an inference run's label folder.

pycocotools loads the COCO exports. The CVAT and Label Studio files are checked here
against the formats' documented layouts and read back with maskops' own readers: every
polygon, rasterised, must cover its RLE mask with IoU >= 0.95, every brush mask come back
exact. The tools' own libraries (Datumaro, label-studio-sdk: outside the lock, whose pins
they refuse) load them in test_export_interop.py.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from maskops.cli.main import main
from maskops.data.demo import DemoDataset
from maskops.data.formats import to_coco
from maskops.data.formats.predictions import export_predictions
from maskops.masks import rle_to_polygons
from maskops.spec import spec_to_text
from maskops.spec.models import ExperimentSpec

MIN_IOU = 0.95


def _rles(document: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for ann in document["annotations"]:
        seg = ann["segmentation"]
        if isinstance(seg, list):
            out.append(mask_utils.merge(mask_utils.frPyObjects(seg, 128, 128)))
        else:
            out.append({"size": seg["size"], "counts": seg["counts"].encode()})
    return out


def _ious(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[float]:
    return [float(mask_utils.iou([x], [y], [0])[0][0]) for x, y in zip(a, b, strict=True)]


def test_every_export_loads_and_matches_the_masks(label_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "exports"
    written = export_predictions(
        label_dir, out, ["coco", "cvat", "labelstudio", "labelstudio-brush"], model_version="v7"
    )
    assert {p.name for p in written} == {
        "predictions_coco_polygons.json",
        "predictions_coco_rle.json",
        "predictions_cvat.xml",
        "predictions_labelstudio.json",
        "labelstudio_config.xml",
        "predictions_labelstudio_brush.json",
        "labelstudio_brush_config.xml",
    }
    rle_doc = json.loads((out / "predictions_coco_rle.json").read_text())
    polygon_doc = json.loads((out / "predictions_coco_polygons.json").read_text())
    for path in (out / "predictions_coco_rle.json", out / "predictions_coco_polygons.json"):
        coco = COCO(str(path))  # the reference reader of the format loads it
        assert len(coco.getAnnIds()) == len(rle_doc["annotations"])
    masks = _rles(rle_doc)
    assert min(_ious(masks, _rles(polygon_doc))) >= MIN_IOU
    assert all(
        a["score"] == b["score"]
        for a, b in zip(rle_doc["annotations"], polygon_doc["annotations"], strict=True)
    )

    # CVAT for images 1.1: the documented elements, and our reader gets the masks back.
    root = ET.parse(out / "predictions_cvat.xml").getroot()
    assert root.tag == "annotations" and root.findtext("version") == "1.1"
    assert [e.findtext("name") for e in root.iter("label")] == [
        c["name"] for c in rle_doc["categories"]
    ]
    scores = [float(a.text or "") for a in root.iter("attribute") if a.get("name") == "score"]
    assert len(scores) >= len(masks) and all(0 <= s <= 1 for s in scores)
    back = to_coco("cvat", out / "predictions_cvat.xml", label_dir).document()
    assert min(_ious(masks, _rles(back))) >= MIN_IOU

    # Label Studio pre-annotations: tasks with predictions (model version, scores),
    # percent coordinates, regions naming the config's control and image.
    tasks = json.loads((out / "predictions_labelstudio.json").read_text())
    config = ET.fromstring((out / "labelstudio_config.xml").read_text())
    control = config.find("PolygonLabels")
    assert control is not None
    names = {label.get("value") for label in control}
    for task in tasks:
        assert task["data"]["image"].startswith("/data/local-files/?d=")
        (prediction,) = task["predictions"]
        assert prediction["model_version"] == "v7" and 0 <= prediction["score"] <= 1
        for region in prediction["result"]:
            assert region["type"] == "polygonlabels" and region["to_name"] == "image"
            assert region["from_name"] == control.get("name")
            assert set(region["value"]["polygonlabels"]) <= names
            assert all(0 <= v <= 100 for point in region["value"]["points"] for v in point)
    back = to_coco("labelstudio", out / "predictions_labelstudio.json", label_dir).document()
    assert min(_ious(masks, _rles(back))) >= MIN_IOU

    # The same as brush masks: a BrushLabels interface, and every mask back pixel for pixel.
    config = ET.fromstring((out / "labelstudio_brush_config.xml").read_text())
    control = config.find("BrushLabels")
    assert control is not None and control.get("name") == "label"
    assert [e.get("value") for e in control] == [c["name"] for c in rle_doc["categories"]]
    tasks = json.loads((out / "predictions_labelstudio_brush.json").read_text())
    regions = [r for t in tasks for r in t["predictions"][0]["result"]]
    assert {r["type"] for r in regions} == {"brushlabels"} and len(regions) == len(masks)
    back = to_coco("labelstudio", out / "predictions_labelstudio_brush.json", label_dir).document()
    assert _exact(back) == _exact(rle_doc)


def _exact(document: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(file name, label, RLE counts) of every instance, sorted."""
    names = {im["id"]: im["file_name"] for im in document["images"]}
    labels = {c["id"]: c["name"] for c in document["categories"]}
    return sorted(
        (names[a["image_id"]], labels[a["category_id"]], a["segmentation"]["counts"])
        for a in document["annotations"]
    )


def test_tolerance_trades_points_for_fidelity(label_dir: Path) -> None:
    detections = json.loads(next(label_dir.glob("0*.json")).read_text())
    rle = detections[0]["segmentation"]
    exact, coarse = rle_to_polygons(rle, 0.0), rle_to_polygons(rle, 1.0)
    assert len(coarse[0]) < len(exact[0])
    target = {"size": rle["size"], "counts": rle["counts"].encode()}
    for polygons in (exact, coarse):
        drawn = mask_utils.merge(mask_utils.frPyObjects(polygons, 128, 128))
        assert mask_utils.iou([target], [drawn], [0])[0][0] >= MIN_IOU


def test_maskops_inference_exports_for_review(
    tmp_path: Path, demo_dataset: DemoDataset, tiny_spec: ExperimentSpec, tiny_checkpoint: Path
) -> None:
    images = tmp_path / "in"
    images.mkdir()
    for source in sorted(Path(demo_dataset.val_images).iterdir())[:2]:
        shutil.copy(source, images / source.name)
    spec = tmp_path / "spec.txt"
    spec.write_text(spec_to_text(tiny_spec))
    results = tmp_path / "results"
    flags = ["-e", str(spec), "-m", str(tiny_checkpoint), "-t", "0.0"]
    wanted = ["--export", "cvat", "--export", "labelstudio"]
    code = main(["inference", "-i", str(images), "-r", str(results), *flags, *wanted])
    assert code == 0
    exports = results / "exports"
    assert sorted(p.name for p in exports.iterdir()) == [
        "labelstudio_config.xml",
        "predictions_cvat.xml",
        "predictions_labelstudio.json",
    ]
    tasks = json.loads((exports / "predictions_labelstudio.json").read_text())
    assert sorted(t["data"]["image"].rsplit("=", 1)[1] for t in tasks) == sorted(
        p.name for p in images.iterdir()
    )
    assert all(t["predictions"][0]["model_version"] == "maskops" for t in tasks)
