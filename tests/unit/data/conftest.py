"""A crafted COCO dataset with one instance of every problem dataset_convert reports, and
an inference label folder of the demo's ground truth (the prediction exports' input)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from maskops.data.demo import DemoDataset


@dataclass(frozen=True)
class BrokenDataset:
    image_dir: Path
    annotation_file: Path
    document: dict[str, Any]


def _square(x: float, y: float, size: float) -> list[float]:
    return [x, y, x + size, y, x + size, y + size, x, y + size]


def _rle(mask: np.ndarray) -> dict[str, Any]:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode()}


def _uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    flat = mask.astype(np.uint8).flatten(order="F")
    counts, current, run = [], 0, 0
    for value in flat.tolist():
        if value != current:
            counts.append(run)
            current, run = value, 0
        run += 1
    counts.append(run)
    return {"size": list(mask.shape), "counts": counts}


def _pixels(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.fixture
def broken_dataset(tmp_path: Path) -> BrokenDataset:
    """Images 64x48 (w x h) unless noted; category ids 5 and 90 (non-contiguous).

    Image 1 carries every annotation-level problem; images 2-11 one image-level problem
    each (11: EXIF-rotated, but annotated on the stored pixels); annotation 901 points at
    the missing image id 77.
    """
    images_dir = tmp_path / "images"
    images_dir.mkdir()
    Image.fromarray(_pixels(48, 64, 1)).save(images_dir / "good.jpg", quality=95)
    good = (images_dir / "good.jpg").read_bytes()
    (images_dir / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (images_dir / "garbage.jpg").write_bytes(b"this is not an image at all")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise for display
    Image.fromarray(_pixels(48, 64, 5)).save(images_dir / "rotated.jpg", exif=exif.tobytes())
    Image.fromarray(_pixels(48, 64, 11)).save(images_dir / "raw.jpg", exif=exif.tobytes())
    Image.fromarray(_pixels(48, 64, 6)[..., 0]).save(images_dir / "gray.png")
    Image.fromarray(_pixels(48, 64, 7)).convert("CMYK").save(images_dir / "cmyk.jpg")
    rgba = np.dstack([_pixels(48, 64, 8), np.full((48, 64), 128, dtype=np.uint8)])
    rgba[:, :32, 3] = 0  # left half fully transparent
    Image.fromarray(rgba, mode="RGBA").save(images_dir / "alpha.png")
    Image.fromarray(_pixels(48, 64, 9)).save(images_dir / "image.bmp")
    Image.fromarray(_pixels(48, 64, 10)).save(images_dir / "mismatch.jpg")

    blob = np.zeros((48, 64), dtype=bool)
    blob[10:20, 30:45] = True
    wrong_size = _rle(np.ones((10, 10), dtype=bool))
    images = [
        {"id": 1, "file_name": "good.jpg", "width": 64, "height": 48},
        {"id": 2, "file_name": "missing.jpg", "width": 64, "height": 48},
        {"id": 3, "file_name": "truncated.jpg", "width": 64, "height": 48},
        {"id": 4, "file_name": "garbage.jpg", "width": 64, "height": 48},
        {"id": 5, "file_name": "rotated.jpg", "width": 48, "height": 64},
        {"id": 6, "file_name": "gray.png", "width": 64, "height": 48},
        {"id": 7, "file_name": "cmyk.jpg", "width": 64, "height": 48},
        {"id": 8, "file_name": "alpha.png", "width": 64, "height": 48},
        {"id": 9, "file_name": "image.bmp", "width": 64, "height": 48},
        {"id": 10, "file_name": "mismatch.jpg", "width": 100, "height": 100},
        {"id": 11, "file_name": "raw.jpg", "width": 64, "height": 48},
    ]

    def ann(ann_id: int, image_id: int, bbox: list[float], seg: Any, **extra: Any) -> dict:
        return {
            "id": ann_id,
            "image_id": image_id,
            "category_id": extra.pop("category_id", 5),
            "bbox": bbox,
            "segmentation": seg,
            "iscrowd": extra.pop("iscrowd", 0),
            "area": 1.0,
        }

    annotations = [
        ann(101, 1, [2, 2, 10, 10], [_square(2, 2, 10)]),
        ann(102, 1, [50, 10, 30, 20], [_square(52, 12, 8)], category_id=90),
        ann(103, 1, [0, 0, 10, 10], [_square(30, 30, 10)]),
        ann(104, 1, [5, 5, 0, 10], [_square(5, 5, 10)]),
        ann(105, 1, [20, 20, 10, 10], [[20, 20, 30, 30], _square(20, 20, 10)]),
        ann(106, 1, [10, 30, 5, 5], []),
        ann(107, 1, [10, 30, 5, 5], [[10, 30, 12, 32, 14, 34]]),
        ann(108, 1, [0, 0, 10, 10], wrong_size),
        ann(109, 1, [0, 0, 10, 10], {"size": [48, 64], "counts": "PPPP~~~~"}),
        ann(110, 1, [2, 2, 10, 10], [_square(2, 2, 10)], category_id=999),
        ann(111, 1, [30, 10, 15, 10], _uncompressed_rle(blob), iscrowd=1),
        ann(112, 1, [30, 10, 15, 10], _rle(blob), category_id=90),
        ann(113, 1, [2, 30, 30, 10], [_square(2, 30, 8), _square(22, 30, 8)]),
        ann(201, 2, [2, 2, 10, 10], [_square(2, 2, 10)]),
        ann(301, 3, [2, 2, 10, 10], [_square(2, 2, 10)]),
        ann(501, 5, [30, 50, 10, 10], [_square(30, 50, 10)]),
        ann(1001, 10, [50, 30, 40, 40], [_square(50, 30, 10)]),
        ann(901, 77, [2, 2, 10, 10], [_square(2, 2, 10)]),
    ]
    document = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": 90, "name": "ninety"}, {"id": 5, "name": "five"}],
    }
    annotation_file = tmp_path / "broken.json"
    annotation_file.write_text(json.dumps(document))
    return BrokenDataset(images_dir, annotation_file, document)


@pytest.fixture
def label_dir(demo_dataset: DemoDataset, tmp_path: Path) -> Path:
    """The demo val split's ground truth as an inference label folder (RLE, scores)."""
    source = json.loads(demo_dataset.val_json.read_text())
    folder = tmp_path / "labels"
    folder.mkdir()
    names = {im["id"]: im["file_name"] for im in source["images"]}
    per_image: dict[int, list[dict[str, Any]]] = {im["id"]: [] for im in source["images"]}
    for k, ann in enumerate(source["annotations"]):
        rle = mask_utils.merge(mask_utils.frPyObjects(ann["segmentation"], 128, 128))
        per_image[ann["image_id"]].append(
            {
                "image_id": ann["image_id"],
                "file_name": names[ann["image_id"]],
                "category_id": ann["category_id"],
                "bbox": ann["bbox"],
                "score": round(0.5 + (k % 5) / 10, 2),
                "segmentation": {"size": [128, 128], "counts": rle["counts"].decode()},
            }
        )
    for image_id, detections in per_image.items():
        (folder / f"{Path(names[image_id]).stem}.json").write_text(json.dumps(detections))
    index = {"images": source["images"], "categories": source["categories"], "annotations": []}
    (folder / "coco_images.json").write_text(json.dumps(index))
    return folder
