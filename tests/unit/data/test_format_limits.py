"""Small inputs that used to cost far more than their size: YAML aliases in a data.yaml,
category names without bound, and masks or instance maps claiming more pixels or
instances than any image maskops reads. Each is refused or bounded before anything is
allocated, reported as a finding on its record, and the rest converts."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from maskops.data.coco import DatasetError
from maskops.data.convert import ConversionResult
from maskops.data.formats import CocoBuilder, convert_labelled_dataset
from maskops.data.limits import MAX_INSTANCES, MAX_LABEL_CHARS, MAX_LABELS, MAX_PIXELS


def _png(folder: Path, name: str, size: tuple[int, int] = (32, 32)) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (90, 90, 90)).save(folder / name)


def _convert(images: Path, annotations: Path, tmp_path: Path, **options: Any) -> ConversionResult:
    return convert_labelled_dataset(images, annotations, tmp_path / "out", workers=1, **options)


def _yolo(tmp_path: Path, data_yaml: str) -> ConversionResult:
    images, labels = tmp_path / "images", tmp_path / "yolo" / "labels"
    _png(images, "a.png")
    labels.mkdir(parents=True, exist_ok=True)
    (labels / "a.txt").write_text("0 0.1 0.1 0.5 0.1 0.5 0.5\n")
    (tmp_path / "yolo" / "data.yaml").write_text(data_yaml)
    return _convert(images, labels, tmp_path, format_name="yolo-seg")


# 304 bytes standing for a list of 4.8 million items: a 24 MB category name as text.
ALIASES = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [*{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}]\n"
    for a, b in zip("abcdef", "bcdefg", strict=True)
)


def test_yaml_aliases_are_refused_as_a_finding(tmp_path: Path) -> None:
    result = _yolo(tmp_path, ALIASES + "names: [*g]\n")
    warnings = json.loads(result.warnings_path.read_text())
    assert "aliases are not supported (*a)" in warnings["data.yaml"]["malformed_record"][0]
    assert result.label_map.names == ["0"] and result.num_annotations == 1
    manifest = tmp_path / "out" / "labels_manifest.json"
    assert manifest.stat().st_size < 10_000


def test_data_yaml_names_are_bounded_in_length_and_count(tmp_path: Path) -> None:
    for names, why in (
        (["x" * (MAX_LABEL_CHARS + 1)], "names[0]: not a name of at most"),
        ([[1, 2]], "names[0]: not a name of at most"),
        ([f"n{k}" for k in range(MAX_LABELS + 1)], f"above the limit of {MAX_LABELS}"),
    ):
        result = _yolo(tmp_path, json.dumps({"names": names}))
        warnings = json.loads(result.warnings_path.read_text())
        assert why in warnings["data.yaml"]["malformed_record"][0]
        assert result.label_map.names == ["0"]
    result = _yolo(tmp_path, "names: {0: cat, 1: dog}\n")
    assert result.label_map.names == ["cat"]


@pytest.mark.parametrize(
    ("image_size", "mask_size", "why"),
    [
        ((20_000, 20_000), (1, 1), "20000 x 20000 pixels, above the limit"),
        ((32, 32), (20_000, 20_000), "20000 x 20000 pixels, above the limit"),
    ],
)
def test_a_cvat_mask_beyond_the_pixel_limit_is_refused_before_decoding(
    tmp_path: Path, image_size: tuple[int, int], mask_size: tuple[int, int], why: str
) -> None:
    images = tmp_path / "images"
    _png(images, "a.png")
    (width, height), (box_w, box_h) = image_size, mask_size
    box = f'left="0" top="0" width="{box_w}" height="{box_h}"'
    mask = f'<mask label="cat" rle="0,{box_w * box_h}" {box}/>'
    polygon = '<polygon label="cat" points="2,2;20,2;20,20"/>'
    path = tmp_path / "annotations.xml"
    path.write_text(
        f'<annotations><image id="0" name="a.png" width="{width}" height="{height}">'
        f"{mask}{polygon}</image></annotations>"
    )
    result = _convert(images, path, tmp_path, format_name="cvat")
    warnings = json.loads(result.warnings_path.read_text())
    assert warnings["1"]["beyond_limit"] == [f"<mask> 0: {why} of {MAX_PIXELS}"]
    assert result.num_annotations == 1  # the polygon


def _png_header(width: int, height: int) -> bytes:
    """A PNG's signature and header claiming ``width`` x ``height`` 8-bit grey pixels, and
    no pixel data: what a reader knows of an image before decoding it."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + header
    ihdr = struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return b"\x89PNG\r\n\x1a\n" + ihdr + struct.pack(">I", 0) + b"IEND\xaeB`\x82"


def test_voc_instance_maps_beyond_8_bits_or_the_pixel_limit_are_refused(tmp_path: Path) -> None:
    root, images = tmp_path / "VOC", tmp_path / "images"
    for sub in ("SegmentationObject", "SegmentationClass"):
        (root / sub).mkdir(parents=True)
    objects = np.zeros((32, 32), dtype=np.uint8)
    objects[2:12, 2:12] = 1
    for stem in ("a", "b", "c"):
        _png(images, f"{stem}.jpg")
        Image.fromarray(objects * 15, mode="L").save(root / "SegmentationClass" / f"{stem}.png")
    Image.fromarray(objects, mode="L").save(root / "SegmentationObject" / "a.png")
    # 16 bits: 1,023 objects in a few KB, each a pass over the whole image.
    sixteen = np.arange(32 * 32, dtype=np.uint16).reshape(32, 32)
    Image.fromarray(sixteen).save(root / "SegmentationObject" / "b.png")
    (root / "SegmentationObject" / "c.png").write_bytes(_png_header(20_000, 20_000))
    result = _convert(images, root, tmp_path, format_name="voc")
    warnings = json.loads(result.warnings_path.read_text())
    assert (
        "b.png: expected an 8-bit palette or grayscale PNG, got mode I;16"
        in (warnings["b.png"]["malformed_record"][0])
    )
    assert "exceeds limit of 178956970 pixels" in warnings["c.png"]["beyond_limit"][0]
    assert (result.num_images, result.num_annotations) == (1, 1)
    assert result.label_map.names == ["person"]


def test_objects_of_an_image_and_labels_are_bounded() -> None:
    builder = CocoBuilder()
    first, second = builder.add_image("a.png", 32, 32), builder.add_image("b.png", 32, 32)
    square = [[2.0, 2.0, 20.0, 2.0, 20.0, 20.0]]
    kept = [builder.add_polygons(first, "cat", square) for _ in range(MAX_INSTANCES + 2)]
    assert kept[-3] is not None and kept[-2:] == [None, None]
    assert builder.findings["1"]["beyond_limit"] == [f"objects past {MAX_INSTANCES} left out"]
    assert builder.add_polygons(second, "cat", square) is not None

    names = CocoBuilder()
    halves = [names.add_image(f"{k}.png", 32, 32) for k in range(2)]
    assert names.add_polygons(halves[0], "x" * (MAX_LABEL_CHARS + 1), square) is None
    for k in range(MAX_LABELS + 1):
        names.add_polygons(halves[k % 2], f"n{k}", square)
    assert len(names.categories()) == MAX_LABELS
    assert names.findings["1"]["beyond_limit"][0].endswith(f"{MAX_LABEL_CHARS + 1} chars")
    assert (
        names.findings["1"]["beyond_limit"][1] == f"label 'n{MAX_LABELS}': past {MAX_LABELS} labels"
    )
    with pytest.raises(ValueError, match=f"at most {MAX_LABELS} names"):
        CocoBuilder(labels=[f"n{k}" for k in range(MAX_LABELS + 1)])


DEEP = 100_000
"""Nesting levels: far beyond the interpreter's recursion limit."""


@pytest.mark.parametrize(
    ("format_name", "text", "why"),
    [
        ("via", '{"a.png": {"regions": ' + "[" * DEEP + "]" * DEEP + "}}", "expected a VIA"),
        ("labelstudio", '[{"data": ' + "[" * DEEP + "]" * DEEP + "}]", "expected a Label"),
        ("coco", '{"images": ' + "[" * DEEP + "]" * DEEP + "}", "invalid JSON: maximum recursion"),
    ],
)
def test_deeply_nested_json_fails_the_conversion_saying_why(
    tmp_path: Path, format_name: str, text: str, why: str
) -> None:
    _png(tmp_path / "images", "a.png")
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(DatasetError, match=f"deep.json: {why}"):
        _convert(tmp_path / "images", path, tmp_path, format_name=format_name)


def test_a_deeply_nested_labelme_file_is_a_finding_and_the_rest_converts(tmp_path: Path) -> None:
    images, folder = tmp_path / "images", tmp_path / "labelme"
    _png(images, "a.png")
    folder.mkdir()
    shape = {"label": "cat", "points": [[2, 2], [20, 2], [20, 20]], "shape_type": "polygon"}
    record = {"shapes": [shape], "imagePath": "a.png", "imageWidth": 32, "imageHeight": 32}
    (folder / "a.json").write_text(json.dumps(record))
    (folder / "b.json").write_text('{"shapes": ' + "[" * DEEP + "]" * DEEP + "}")
    result = _convert(images, folder, tmp_path, format_name="labelme")
    warnings = json.loads(result.warnings_path.read_text())
    assert "maximum recursion depth exceeded" in warnings["b.json"]["malformed_record"][0]
    assert result.num_annotations == 1


def test_a_yolo_image_beyond_the_pixel_limit_is_a_finding(tmp_path: Path) -> None:
    images, labels = tmp_path / "images", tmp_path / "labels"
    _png(images, "a.png")
    (images / "big.png").write_bytes(_png_header(20_000, 20_000))
    labels.mkdir()
    for stem in ("a", "big"):
        (labels / f"{stem}.txt").write_text("0 0.1 0.1 0.5 0.1 0.5 0.5\n")
    result = _convert(images, labels, tmp_path, format_name="yolo-seg", labels=["cat"])
    warnings = json.loads(result.warnings_path.read_text())
    assert (
        "big.png: Image size (400000000 pixels) exceeds" in warnings["big.txt"]["beyond_limit"][0]
    )
    assert (result.num_images, result.num_annotations) == (1, 1)
