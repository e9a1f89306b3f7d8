"""Datasets labelled in other tools' formats: each converts to COCO keeping every instance,
faults are reported per record, a file in another format is refused naming the layout
expected, and the converted data trains and evaluates."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from maskops.data.demo import DemoDataset
from maskops.data.formats import (
    FORMATS,
    FormatMismatch,
    coco_path,
    convert_labelled_dataset,
    cvat,
    labelme,
    labelstudio,
    to_coco,
    via,
    voc,
    yolo_seg,
)
from maskops.data.manifest import Manifest
from maskops.data.validate import WARNING_KINDS
from maskops.spec.models import ExperimentSpec
from maskops_core.dataset_formats import DATASET_FORMATS, EXPECTED

LABELS = ["circle", "square", "triangle"]
"""The demo's categories by name; ids 1, 2, 3 after conversion."""

Writer = Callable[[dict[str, Any], Path], Path]


def _write_via(document: dict[str, Any], folder: Path) -> Path:
    via.write(document, folder / "via_region_data.json")
    return folder / "via_region_data.json"


def _write_labelme(document: dict[str, Any], folder: Path) -> Path:
    labelme.write(document, folder / "labelme", image_prefix="../images/")
    return folder / "labelme"


def _write_cvat(document: dict[str, Any], folder: Path) -> Path:
    path = folder / "annotations.xml"
    cvat.write(document["images"], document["annotations"], document["categories"], path)
    return path


def _write_labelstudio(document: dict[str, Any], folder: Path) -> Path:
    labelstudio.write(document, folder / "export.json")
    return folder / "export.json"


def _write_voc(document: dict[str, Any], folder: Path) -> Path:
    voc.write(document, folder / "VOC", LABELS)
    return folder / "VOC"


def _write_yolo(document: dict[str, Any], folder: Path) -> Path:
    yolo_seg.write(document, folder / "yolo" / "labels", LABELS)
    (folder / "yolo" / "data.yaml").write_text("names: [circle, square, triangle]\n")
    return folder / "yolo" / "labels"


WRITERS: dict[str, Writer] = {
    "via": _write_via,
    "labelme": _write_labelme,
    "cvat": _write_cvat,
    "labelstudio": _write_labelstudio,
    "voc": _write_voc,
    "yolo-seg": _write_yolo,
}


def _masks(document: dict[str, Any]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """file name -> [(label name, RLE)] in annotation order."""
    names = {c["id"]: c["name"] for c in document["categories"]}
    images = {im["id"]: im for im in document["images"]}
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for ann in document["annotations"]:
        image = images[ann["image_id"]]
        seg = ann["segmentation"]
        if isinstance(seg, list):
            rle = mask_utils.merge(mask_utils.frPyObjects(seg, image["height"], image["width"]))
        else:
            rle = {"size": seg["size"], "counts": seg["counts"].encode()}
        out.setdefault(image["file_name"], []).append((names[ann["category_id"]], rle))
    return out


def test_the_registry_is_the_api_list() -> None:
    assert tuple(FORMATS) == DATASET_FORMATS
    assert {name: f.expected for name, f in FORMATS.items()} == EXPECTED


@pytest.mark.parametrize("format_name", list(WRITERS))
def test_round_trip_keeps_every_instance(
    format_name: str, demo_dataset: DemoDataset, tmp_path: Path
) -> None:
    """COCO -> the tool's layout -> maskops' COCO: every instance, label and mask kept."""
    source = json.loads(demo_dataset.train_json.read_text())
    annotations = WRITERS[format_name](source, tmp_path)
    labels = None if format_name == "yolo-seg" else LABELS  # yolo: data.yaml names them
    result = convert_labelled_dataset(
        demo_dataset.train_images,
        annotations,
        tmp_path / "out",
        format_name=format_name,
        labels=labels,
        tag="train",
        workers=1,
    )
    converted = json.loads(coco_path(tmp_path / "out", "train").read_text())
    assert result.warning_counts == {}
    assert result.num_annotations == len(source["annotations"])
    assert [(c.id, c.name) for c in result.label_map.categories] == list(enumerate(LABELS, 1))
    if format_name in ("via", "yolo-seg", "voc"):  # sizes not in the file: read from images
        for image in converted["images"]:
            image.setdefault("width", 128)
            image.setdefault("height", 128)
    expected, got = _masks(source), _masks(converted)
    assert got.keys() == expected.keys()
    for file_name, objects in expected.items():
        assert [label for label, _ in got[file_name]] == [label for label, _ in objects]
        for (_, want), (_, have) in zip(objects, got[file_name], strict=True):
            assert mask_utils.iou([want], [have], [0])[0][0] >= 0.99, file_name


def _png(size: tuple[int, int], folder: Path, name: str) -> None:
    Image.new("RGB", size, (90, 90, 90)).save(folder / name)


def test_via_faults_are_reported_per_image(tmp_path: Path) -> None:
    """Missing image, a 2-point polygon, coordinates outside the image, an unknown label
    and a region that is not VIA's: each reported, the rest converted."""
    images = tmp_path / "images"
    images.mkdir()
    _png((64, 48), images, "a.png")

    def region(xs: list[float], ys: list[float], label: str = "cat") -> dict[str, Any]:
        shape = {"name": "polygon", "all_points_x": xs, "all_points_y": ys}
        return {"shape_attributes": shape, "region_attributes": {"label": label}}

    document = {
        "a.png-1": {
            "filename": "a.png",
            "size": 1,
            "regions": [
                region([2, 20, 20], [2, 2, 20]),  # good
                region([2, 20], [2, 2]),  # fewer than 3 points
                region([40, 90, 90], [10, 10, 40]),  # reaches outside 64 x 48
                region([2, 20, 20], [2, 2, 20], label="dog"),  # not in the label list
                {"shape_attributes": {"name": "polygon"}, "region_attributes": {}},
                {"shape_attributes": {"name": "point", "cx": 1, "cy": 1}},
            ],
        },
        "missing.png-1": {
            "filename": "missing.png",
            "size": 1,
            "regions": [region([1, 9, 9], [1, 1, 9])],
        },
    }
    path = tmp_path / "via_region_data.json"
    path.write_text(json.dumps(document))
    result = convert_labelled_dataset(
        images, path, tmp_path / "out", format_name="via", labels=["cat"], workers=1
    )
    warnings = json.loads(result.warnings_path.read_text())
    assert warnings["1"]["degenerate_polygon"] == [2] and warnings["1"]["empty_mask"] == [2]
    assert warnings["1"]["box"] == [3]
    assert warnings["1"]["unknown_label"] == ["dog"]
    assert "all_points_x" in warnings["1"]["malformed_record"][0]
    assert warnings["1"]["unsupported_shape"] == ["point"]
    assert warnings["2"]["missing_file"] == ["missing.png"]
    assert set(result.warning_counts) <= set(WARNING_KINDS)
    assert (result.num_images, result.num_annotations) == (1, 2)


def _mask_png(mask: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(mask.astype(np.uint8) * 255).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_labelme_folder_with_a_malformed_file_and_a_disagreeing_mask(tmp_path: Path) -> None:
    images, folder = tmp_path / "images", tmp_path / "labelme"
    images.mkdir()
    folder.mkdir()
    block = np.ones((10, 10), dtype=bool)
    for name in ("a", "b"):
        _png((32, 32), images, f"{name}.png")
        shapes = [
            {"label": "cat", "points": [[2, 2], [12, 2], [12, 12]], "shape_type": "polygon"},
            # A mask whose own box (points) is far from its pixels: they disagree.
            {
                "label": "cat",
                "points": [[20, 20], [29, 29]],
                "shape_type": "mask",
                "mask": _mask_png(block),
            },
        ]
        record = {"shapes": shapes, "imagePath": f"../images/{name}.png"}
        (folder / f"{name}.json").write_text(
            json.dumps(record | {"imageWidth": 32, "imageHeight": 32})
        )
    (folder / "broken.json").write_text('{"shapes": [')
    result = convert_labelled_dataset(
        images, folder, tmp_path / "out", format_name="labelme", workers=1
    )
    warnings = json.loads(result.warnings_path.read_text())
    assert "broken.json" in warnings["broken.json"]["malformed_record"][0]
    assert result.num_images == 2 and result.num_annotations == 4
    assert warnings.get("1", {}).get("mask_polygon_mismatch") is None  # mask where it says


@pytest.mark.parametrize(
    ("format_name", "declared"),
    [("via", "labelstudio"), ("labelstudio", "via"), ("via", "cvat"), ("cvat", "labelme")],
)
def test_a_file_in_another_format_names_the_layout_expected(
    format_name: str, declared: str, demo_dataset: DemoDataset, tmp_path: Path
) -> None:
    source = json.loads(demo_dataset.val_json.read_text())
    annotations = WRITERS[format_name](source, tmp_path)
    with pytest.raises(FormatMismatch, match="expected " + FORMATS[declared].expected[:12]):
        to_coco(declared, annotations, demo_dataset.val_images)


def test_voc_box_disagreeing_with_its_mask_is_reported(tmp_path: Path) -> None:
    root, images = tmp_path / "VOC", tmp_path / "images"
    images.mkdir()
    _png((32, 32), images, "x.jpg")
    objects = np.zeros((32, 32), dtype=np.uint8)
    objects[2:12, 2:12] = 1
    for sub, array in (("SegmentationObject", objects), ("SegmentationClass", objects * 8)):
        (root / sub).mkdir(parents=True)
        Image.fromarray(array, mode="L").save(root / sub / "x.png")
    (root / "Annotations").mkdir()
    (root / "Annotations" / "x.xml").write_text(
        "<annotation><object><name>cat</name><bndbox><xmin>20</xmin><ymin>20</ymin>"
        "<xmax>30</xmax><ymax>30</ymax></bndbox></object></annotation>"
    )
    builder = to_coco("voc", root, images)
    assert builder.categories() == [{"id": 1, "name": "cat"}]
    assert builder.findings["1"]["mask_polygon_mismatch"] == ["cat: IoU 0.00"]


def test_datasets_from_every_format_train_and_evaluate(
    demo_dataset: DemoDataset, tiny_spec: ExperimentSpec, tmp_path: Path
) -> None:
    """One short training on the train split written in every format (one shard set per
    format, one label map), evaluated on the val split converted from LabelMe."""
    from maskops.training import run_training

    train_dir, val_dir = tmp_path / "train", tmp_path / "val"
    source = json.loads(demo_dataset.train_json.read_text())
    for format_name, writer in WRITERS.items():
        (tmp_path / format_name).mkdir()
        annotations = writer(source, tmp_path / format_name)
        convert_labelled_dataset(
            demo_dataset.train_images,
            annotations,
            train_dir,
            format_name=format_name,
            labels=None if format_name == "yolo-seg" else LABELS,
            tag=format_name,
            workers=1,
        )
    (tmp_path / "val_labelme").mkdir()
    val = _write_labelme(json.loads(demo_dataset.val_json.read_text()), tmp_path / "val_labelme")
    converted = convert_labelled_dataset(
        demo_dataset.val_images, val, val_dir, format_name="labelme", tag="val", workers=1
    )
    assert converted.warning_counts == {}
    data = tiny_spec.data_config.model_copy(
        update={
            "training_file_pattern": f"{train_dir}/*.tar",
            "validation_file_pattern": f"{val_dir}/*.tar",
            "val_json_file": str(coco_path(val_dir, "val")),
        }
    )
    spec = tiny_spec.model_copy(update={"data_config": data, "total_steps": 2})
    result = run_training(spec, tmp_path / "run")
    assert result.step == 2 and result.checkpoint is not None
    assert 0.0 <= float(result.metrics["mask_AP"]) <= 1.0, result.metrics


def test_dataset_convert_command_reads_a_format(
    demo_dataset: DemoDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from maskops.cli.main import main

    annotations = _write_labelstudio(json.loads(demo_dataset.val_json.read_text()), tmp_path)
    common = ["-i", str(demo_dataset.val_images), "-a", str(annotations), "-o", str(tmp_path)]
    assert main(["dataset_convert", *common, "--format", "via"]) == 2
    assert "expected a VIA JSON export" in capsys.readouterr().err
    labels = ["--labels", "triangle,square,circle"]
    assert main(["dataset_convert", *common, "--format", "labelstudio", *labels]) == 0
    out = capsys.readouterr().out
    assert "read labelstudio annotations into" in out and "1 -> 1   triangle" in out
    assert Manifest.load(tmp_path / "export_manifest.json").num_images == demo_dataset.num_val
