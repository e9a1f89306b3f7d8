"""Records that used to stop or crash a whole conversion: polygons with huge coordinates,
Label Studio tasks and YOLO lines that are not what the format documents, data.yaml files
that do not parse, negative image sizes, and VIA regions that name no label. Each is a
finding on its record and the rest converts; a split that keeps nothing fails saying why."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from maskops.data.coco import DatasetError
from maskops.data.convert import ConversionResult, convert_dataset
from maskops.data.formats import coco_path, convert_labelled_dataset, to_coco
from maskops.data.formats.builder import DEFAULT_LABEL
from maskops.data.validate import WARNING_KINDS, clip_polygon
from tests.unit.data.test_formats import LABELS, WRITERS

HUGE = [0.0, 0.0, 1e10, 0.0, 1e10, 1e10, 0.0, 1e10]
"""A square reaching 1e10 px: pycocotools overflows on it and kills the process."""
SQUARE = [4.0, 4.0, 20.0, 4.0, 20.0, 20.0, 4.0, 20.0]


def _png(folder: Path, name: str, size: tuple[int, int] = (32, 32)) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (90, 90, 90)).save(folder / name)


def _in_child(run: Callable[[], None]) -> int | None:
    """``run``'s exit code in a forked process: a crash there fails the test, not pytest."""
    child = multiprocessing.get_context("fork").Process(target=run)
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
        child.join()
    return child.exitcode


def _coco(*polygons: list[float]) -> dict[str, Any]:
    return {
        "images": [{"id": 1, "file_name": "a.png", "width": 32, "height": 32}],
        "annotations": [
            {
                "id": k,
                "image_id": 1,
                "category_id": 1,
                "bbox": [0, 0, 32, 32],
                "iscrowd": 0,
                "segmentation": [polygon],
            }
            for k, polygon in enumerate(polygons, start=1)
        ],
        "categories": [{"id": k, "name": n} for k, n in enumerate(LABELS, start=1)],
    }


def test_clipping_keeps_what_lies_inside_the_image() -> None:
    """A far polygon is cut to the image grown by its size, and rasterises as it would."""
    inside, far = clip_polygon(SQUARE, 32, 32)
    assert (inside, far) == (SQUARE, False)
    triangle = [-1e9, 16.0, 60.0, -5e8, 60.0, 4e6]  # edges crossing the image obliquely
    clipped, far = clip_polygon(triangle, 32, 32)
    assert far and all(-32 <= v <= 64 for v in clipped)
    moderate = clip_polygon([-1e4, 16.0, 60.0, -5e3, 60.0, 4e3], 32, 32)[0]
    whole = mask_utils.frPyObjects([[-1e4, 16.0, 60.0, -5e3, 60.0, 4e3]], 32, 32)
    cut = mask_utils.frPyObjects([moderate], 32, 32)
    assert (mask_utils.decode(whole) == mask_utils.decode(cut)).all()


@pytest.mark.parametrize(
    "format_name", ["coco", "via", "labelme", "cvat", "labelstudio", "yolo-seg"]
)
def test_a_polygon_at_1e10_is_clipped_and_reported_in_every_format(
    format_name: str, tmp_path: Path
) -> None:
    images = tmp_path / "images"
    _png(images, "a.png")
    document = _coco(SQUARE, HUGE)
    if format_name == "coco":
        annotations = tmp_path / "a.json"
        annotations.write_text(json.dumps(document))
    else:
        annotations = WRITERS[format_name](document, tmp_path)
    out = tmp_path / "out"

    def convert() -> None:
        convert_labelled_dataset(
            images, annotations, out, format_name=format_name, labels=LABELS, workers=1
        )

    assert _in_child(convert) == 0  # without clipping: SIGSEGV (-11)
    warnings = json.loads((out / f"{annotations.stem}_warnings.json").read_text())
    assert warnings["1"]["far_polygon"] == [2]
    assert "far_polygon" in WARNING_KINDS
    manifest = json.loads((out / f"{annotations.stem}_manifest.json").read_text())
    assert manifest["num_annotations"] == 2  # the far square covers the image's corner


def test_a_labelme_box_at_1e10_beside_a_mask_is_compared_clipped(tmp_path: Path) -> None:
    from tests.unit.data.test_formats import _mask_png

    images, folder = tmp_path / "images", tmp_path / "labelme"
    _png(images, "a.png")
    folder.mkdir()
    mask = {"label": "cat", "points": [[0, 0], [1e10, 1e10]], "shape_type": "mask"}
    record = {
        "shapes": [mask | {"mask": _mask_png(np.ones((10, 10), dtype=bool))}],
        "imagePath": "a.png",
        "imageWidth": 32,
        "imageHeight": 32,
    }
    (folder / "a.json").write_text(json.dumps(record))
    findings = tmp_path / "findings.json"

    def read() -> None:
        findings.write_text(json.dumps(to_coco("labelme", folder, images).findings))

    assert _in_child(read) == 0  # without clipping: SIGSEGV (-11)
    assert json.loads(findings.read_text())["1"]["mask_polygon_mismatch"] == ["cat: IoU 0.10"]


def _tasks(tmp_path: Path, tasks: list[Any]) -> Path:
    path = tmp_path / "export.json"
    path.write_text(json.dumps(tasks))
    return path


def _region(width: float = 32, height: float = 32) -> dict[str, Any]:
    value = {"points": [[10, 10], [60, 10], [60, 60]], "polygonlabels": ["circle"]}
    return {
        "type": "polygonlabels",
        "original_width": width,
        "original_height": height,
        "value": value,
    }


def _convert(images: Path, annotations: Path, tmp_path: Path, **options: Any) -> ConversionResult:
    return convert_labelled_dataset(images, annotations, tmp_path / "out", workers=1, **options)


def test_label_studio_tasks_that_are_not_tasks_are_findings(tmp_path: Path) -> None:
    images = tmp_path / "images"
    for name in ("a.png", "b.png", "c.png"):
        _png(images, name)
    path = _tasks(
        tmp_path,
        [
            {"data": {"image": "/data/upload/a.png"}, "annotations": [{"result": [_region()]}]},
            {"data": {}, "annotations": [{"result": [_region()]}]},
            {"data": {"image": "b.png"}, "annotations": [{"result": 5}]},
            {"data": {"image": "c.png"}, "annotations": [{"result": [5, _region(-32), _region()]}]},
        ],
    )
    result = _convert(images, path, tmp_path, format_name="labelstudio", labels=["circle"])
    warnings = json.loads(result.warnings_path.read_text())
    assert [m.split(":")[0] for m in warnings["export.json"]["malformed_record"]] == [
        "tasks[1]",
        "tasks[2]",
    ]
    assert "size -32 x 32" in warnings["2"]["malformed_record"][0]  # c.png's first size
    assert [m.split(":")[0] for m in warnings["2"]["malformed_record"][1:]] == [
        "result[0]",
        "result[1]",
    ]
    assert (result.num_images, result.num_annotations) == (2, 2)


def test_yolo_lines_and_data_yaml_that_are_not_the_format_are_findings(tmp_path: Path) -> None:
    images, labels = tmp_path / "images", tmp_path / "yolo" / "labels"
    _png(images, "a.png")
    labels.mkdir(parents=True)
    (labels / "a.txt").write_text("0 0.1\n0 0.1 0.1 0.5 0.1 0.5 0.5\n0 0.5 0.5 0.2\n")
    for text, why in (("names: [a, b\n", "while parsing"), ("- a\n- b\n", "got a list")):
        (tmp_path / "yolo" / "data.yaml").write_text(text)
        result = _convert(images, labels, tmp_path, format_name="yolo-seg")
        warnings = json.loads(result.warnings_path.read_text())
        assert why in warnings["data.yaml"]["malformed_record"][0]
        assert warnings["1"]["malformed_record"] == [
            "line 1: 1 coordinates",
            "line 3: 3 coordinates",
        ]
        assert result.num_annotations == 1 and result.label_map.names == ["0"]


def test_a_negative_cvat_image_size_is_a_finding_on_that_image(tmp_path: Path) -> None:
    images = tmp_path / "images"
    for name in ("a.png", "b.png"):
        _png(images, name)
    polygon = '<polygon label="cat" points="2,2;20,2;20,20"/>'
    path = tmp_path / "annotations.xml"
    path.write_text(
        "<annotations><version>1.1</version>"
        f'<image id="0" name="a.png" width="-32" height="32">{polygon}</image>'
        f'<image id="1" name="b.png" width="32" height="32">{polygon}</image></annotations>'
    )
    result = _convert(images, path, tmp_path, format_name="cvat")
    warnings = json.loads(result.warnings_path.read_text())
    assert "width -32" in warnings["annotations.xml"]["malformed_record"][0]
    assert (result.num_images, result.num_annotations) == (1, 1)


def test_a_negative_labelme_image_size_is_a_finding_and_the_file_size_is_used(
    tmp_path: Path,
) -> None:
    images, folder = tmp_path / "images", tmp_path / "labelme"
    _png(images, "a.png")
    folder.mkdir()
    shape = {"label": "cat", "points": [[2, 2], [20, 2], [20, 20]], "shape_type": "polygon"}
    record = {"shapes": [shape], "imagePath": "a.png", "imageWidth": -32, "imageHeight": 32}
    (folder / "a.json").write_text(json.dumps(record))
    result = _convert(images, folder, tmp_path, format_name="labelme")
    warnings = json.loads(result.warnings_path.read_text())
    assert warnings["1"]["malformed_record"] == ["a.png: size -32 x 32"]
    assert (result.num_images, result.num_annotations) == (1, 1)


def _balloons(tmp_path: Path, regions: int = 3) -> tuple[Path, Path]:
    """A VIA project as the balloon tutorial's: one class, ``region_attributes`` empty."""
    images = tmp_path / "images"
    _png(images, "a.png")
    shape = {"name": "polygon", "all_points_x": [2, 20, 20], "all_points_y": [2, 2, 20]}
    entry = {
        "filename": "a.png",
        "size": 1,
        "regions": {
            str(k): {"shape_attributes": shape, "region_attributes": {}} for k in range(regions)
        },
        "file_attributes": {},
    }
    path = tmp_path / "via_region_data.json"
    path.write_text(json.dumps({"a.png1": entry}))
    return images, path


@pytest.mark.parametrize(("labels", "name"), [(None, DEFAULT_LABEL), (["droplet"], "droplet")])
def test_via_regions_without_a_label_take_the_single_label(
    labels: list[str] | None, name: str, tmp_path: Path
) -> None:
    images, path = _balloons(tmp_path)
    result = _convert(images, path, tmp_path, format_name="via", labels=labels)
    assert result.num_annotations == 3 and result.label_map.names == [name]
    assert result.warning_counts == {"default_label": 3}


def test_a_split_that_keeps_no_object_fails_saying_what_to_pass(tmp_path: Path) -> None:
    images, path = _balloons(tmp_path)
    with pytest.raises(DatasetError, match=r"no annotation kept of 3 objects.*single label"):
        _convert(images, path, tmp_path, format_name="via", labels=["a", "b"])
    document = json.loads(path.read_text())
    for region in document["a.png1"]["regions"].values():
        region["region_attributes"] = {"label": "balloon"}
    path.write_text(json.dumps(document))
    with pytest.raises(DatasetError, match=r"unknown_label 3\).*'balloon': pass labels"):
        _convert(images, path, tmp_path, format_name="via", labels=["droplet"])
    assert not coco_path(tmp_path / "out", path.stem).exists()


def test_coco_far_polygons_need_no_format_reader(tmp_path: Path) -> None:
    """The same clipping for COCO files, which no reader touches."""
    images = tmp_path / "images"
    _png(images, "a.png")
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_coco(SQUARE, [0, 0, 4e6, 0, 4e6, 4e6, 0, 4e6])))
    result = convert_dataset(images, path, tmp_path / "out", workers=1)
    assert result.warning_counts["far_polygon"] == 1 and result.num_annotations == 2


def test_labels_groups_and_attributes_of_the_wrong_type_are_findings(tmp_path: Path) -> None:
    """A label, group id or region attributes that is a list or an object (not text) is a
    finding on that record; the image's other objects convert."""
    images = tmp_path / "images"
    _png(images, "a.png")
    studio = _region()
    studio["value"]["polygonlabels"] = [["circle"]]
    studio["group_id"] = 1
    task = {"data": {"image": "a.png"}, "annotations": [{"result": [studio, _region()]}]}
    path = _tasks(tmp_path, [task])
    result = _convert(images, path, tmp_path, format_name="labelstudio", tag="studio")
    warnings = json.loads(result.warnings_path.read_text())
    assert warnings["1"]["malformed_record"][0].startswith("result[0]: TypeError")
    assert result.num_annotations == 1

    square = [[x, y] for x, y in zip(SQUARE[0::2], SQUARE[1::2], strict=True)]
    shape = {"label": "circle", "points": square, "shape_type": "polygon"}
    labelme = tmp_path / "labelme"
    labelme.mkdir()
    (labelme / "a.json").write_text(
        json.dumps({"imagePath": "a.png", "shapes": [{**shape, "group_id": [1]}, shape]})
    )
    result = _convert(images, labelme, tmp_path, format_name="labelme", tag="labelme")
    warnings = json.loads(result.warnings_path.read_text())
    assert warnings["1"]["malformed_record"][0].startswith("shapes[0]: TypeError")
    assert result.num_annotations == 1

    polygon = {"name": "polygon", "all_points_x": SQUARE[0::2], "all_points_y": SQUARE[1::2]}
    regions = [
        {"shape_attributes": polygon, "region_attributes": ["circle", "square"]},
        {"shape_attributes": polygon, "region_attributes": {"label": "circle"}},
    ]
    via = tmp_path / "via.json"
    via.write_text(json.dumps({"a.png1": {"filename": "a.png", "regions": regions}}))
    result = _convert(images, via, tmp_path, format_name="via", tag="via")
    warnings = json.loads(result.warnings_path.read_text())
    assert warnings["1"]["malformed_record"][0].startswith("regions[0]: TypeError")
    assert result.num_annotations == 1
