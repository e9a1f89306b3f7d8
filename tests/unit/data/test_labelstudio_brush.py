"""Label Studio brush masks: its RLE both ways, and ``brushlabels`` regions read into COCO.

The encoder is checked against label-studio-sdk's own test vector, the decoder against a
stream written by hand with chunks Label Studio's editor writes and its Python encoder
does not (several literal values in one chunk, other field sizes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from maskops.data.demo import DemoDataset
from maskops.data.formats import coco_path, convert_labelled_dataset, labelstudio, to_coco
from maskops.data.formats.labelstudio_rle import decode, encode, from_mask, to_mask

SDK_VALUES = [1, 1, 1, 1, 2, 3, 5, 6, 7, 8, 4, 4, 4, 4, 4, 4, 4, 4]
SDK_RLE = [0, 0, 0, 18, 57, 27, 252, 96, 32, 1, 0, 6, 0, 40, 0, 192, 3, 128, 17, 56, 32]
"""label-studio-sdk, tests/custom/converter/test_brush.py ``test_rle_encoding``: its
``encode_rle`` of ``SDK_VALUES`` (the same test as label-studio-converter's)."""


def test_encode_gives_label_studio_sdk_bytes() -> None:
    assert encode(np.array(SDK_VALUES)) == SDK_RLE
    assert decode(SDK_RLE).tolist() == SDK_VALUES


def _stream(fields: list[tuple[int, int]]) -> list[int]:
    bits = "".join(f"{value:0{size}b}" for value, size in fields)
    bits += "0" * (-len(bits) % 8)
    return [int(bits[k : k + 8], 2) for k in range(0, len(bits), 8)]


def test_decode_reads_literal_chunks_and_any_field_sizes() -> None:
    # 7 values of 4-bit words, run fields of 2, 5, 1 and 12 bits.
    header = [(7, 32), (4 - 1, 5), (1, 4), (4, 4), (0, 4), (11, 4)]
    literal = [(0, 1), (0, 2), (3 - 1, 2), (1, 4), (15, 4), (2, 4)]  # 3 values as written
    repeat = [(1, 1), (1, 2), (4 - 1, 5), (9, 4)]  # 4 times 9
    values = decode(_stream(header + literal + repeat))
    assert values.tolist() == [1, 15, 2, 9, 9, 9, 9]


@pytest.mark.parametrize(
    "lengths", [[1], [8, 9], [16, 17, 256], [257, 1, 65536], [65537, 3], [131073, 2**16 * 3]]
)
def test_round_trip_across_run_field_boundaries(lengths: list[int]) -> None:
    values = np.repeat(np.arange(len(lengths), dtype=np.uint8) * 40 + 7, lengths)
    assert np.array_equal(decode(encode(values)), values)


def test_mask_round_trip_and_faults() -> None:
    mask = np.zeros((30, 50), dtype=bool)
    mask[5:20, 10:40] = True
    mask[25, 3] = True
    rle = from_mask(mask)
    assert np.array_equal(to_mask(rle, 50, 30), mask)
    with pytest.raises(ValueError, match="holds 6000 values, expected 6004"):
        to_mask(rle, 1501, 1)
    with pytest.raises(ValueError, match="ends inside a field"):
        decode(rle[:-6])
    with pytest.raises(ValueError, match="bytes"):
        decode([*rle[:-1], 256])
    with pytest.raises(ValueError, match="out of range"):
        to_mask(rle, 100_000, 100_000)


def _brush(label: str, mask: np.ndarray, **value: Any) -> dict[str, Any]:
    height, width = mask.shape
    return {
        "type": "brushlabels",
        "original_width": width,
        "original_height": height,
        "value": {"format": "rle", "rle": from_mask(mask), "brushlabels": [label]} | value,
    }


def test_a_brush_region_becomes_an_rle_instance_and_bad_ones_are_reported(
    tmp_path: Path,
) -> None:
    mask = np.zeros((48, 64), dtype=bool)
    mask[10:30, 5:25] = True
    mask[12:20, 40:60] = True  # one stroke in two parts: one object
    wrong_size = _brush("cat", np.ones((10, 10), dtype=bool))
    wrong_size |= {"original_width": 64, "original_height": 48}
    tasks = [
        {
            "data": {"image": "/data/upload/1/3f2a1b2c-a.png"},
            "annotations": [
                {"result": [_brush("cat", mask), wrong_size, _brush("dog", mask, format="png")]}
            ],
        }
    ]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(tasks))
    builder = to_coco("labelstudio", path, tmp_path, ["cat", "dog"])
    (ann,) = builder.document()["annotations"]
    assert ann["category_id"] == 1 and ann["area"] == mask.sum() == 20 * 20 + 8 * 20
    assert ann["bbox"] == [5.0, 10.0, 55.0, 20.0]
    rle = ann["segmentation"] | {"counts": ann["segmentation"]["counts"].encode()}
    assert np.array_equal(mask_utils.decode(rle).astype(bool), mask)
    findings = builder.findings["1"]
    assert findings["unsupported_shape"] == ["brush png"]
    (fault,) = findings["malformed_record"]
    assert fault.startswith("result[1]:") and "expected 12288" in fault


def test_demo_dataset_as_brush_pre_annotations_converts_pixel_for_pixel(
    demo_dataset: DemoDataset, tmp_path: Path
) -> None:
    """maskops' brush export, read back through the whole conversion: every mask exact."""
    source = json.loads(demo_dataset.val_json.read_text())
    rles = []
    for ann in source["annotations"]:
        rle = mask_utils.merge(mask_utils.frPyObjects(ann["segmentation"], 128, 128))
        rles.append(ann | {"segmentation": rle | {"counts": rle["counts"].decode()}})
    tasks = labelstudio.tasks(
        source["images"], rles, source["categories"], model_version="v1", brush=True
    )
    path = tmp_path / "brush.json"
    path.write_text(json.dumps(tasks))
    result = convert_labelled_dataset(
        demo_dataset.val_images, path, tmp_path / "out", format_name="labelstudio",
        tag="val", workers=1,
    )  # fmt: skip
    assert result.warning_counts == {}
    converted = json.loads(coco_path(tmp_path / "out", "val").read_text())
    assert _instances(converted) == _instances(source | {"annotations": rles})
    assert [a["area"] for a in converted["annotations"]] == [
        float(mask_utils.area(a["segmentation"] | {"counts": a["segmentation"]["counts"].encode()}))
        for a in converted["annotations"]
    ]


def _instances(document: dict[str, Any]) -> list[tuple[str, str, str, float]]:
    """(file name, label, COCO RLE counts, mask area) of every instance, sorted."""
    names = {im["id"]: im["file_name"] for im in document["images"]}
    labels = {c["id"]: c["name"] for c in document["categories"]}
    out = []
    for ann in document["annotations"]:
        rle = ann["segmentation"]
        area = float(mask_utils.area(rle | {"counts": rle["counts"].encode()}))
        out.append((names[ann["image_id"]], labels[ann["category_id"]], rle["counts"], area))
    return sorted(out)
