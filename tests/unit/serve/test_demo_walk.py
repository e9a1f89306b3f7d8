"""The demo walk's last step: what it prints about /infer's answer and the picture it draws."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pycocotools.mask as mask_util
from PIL import Image

from maskops_serve.demo import (
    SHOWN_SCORE,
    describe_detections,
    draw_demo_detections,
    labelled_twice,
)


def _detection(
    name: str, category_id: int, score: float, box: tuple[int, int, int, int]
) -> dict[str, Any]:
    x, y, w, h = box
    mask = np.zeros((64, 96), dtype=np.uint8)
    mask[y : y + h, x : x + w] = 1
    rle = mask_util.encode(np.asfortranarray(mask))
    return {
        "image_id": 0,
        "category_id": category_id,
        "category_name": name,
        "score": score,
        "bbox": [float(v) for v in box],
        # As /infer answers: compressed RLE with a text ``counts``.
        "segmentation": {"size": [64, 96], "counts": rle["counts"].decode()},
    }


def test_detections_are_listed_by_name_best_first_and_low_scores_counted() -> None:
    detections = [
        _detection("square", 3, 0.71, (40, 10, 20, 20)),
        _detection("circle", 1, 0.97, (5, 5, 20, 20)),
        _detection("triangle", 7, 0.12, (60, 30, 10, 10)),
    ]

    text = describe_detections(detections)

    assert text == f"3 detections: circle 0.97, square 0.71 (and 1 below {SHOWN_SCORE})"


def test_the_best_detection_is_named_even_below_the_threshold() -> None:
    assert describe_detections([_detection("circle", 1, 0.2, (0, 0, 4, 4))]) == (
        "1 detection: circle 0.20"
    )
    assert describe_detections([]) == "0 detections"


def test_a_shape_listed_under_two_classes_is_named_and_nothing_else_is() -> None:
    square = _detection("square", 3, 0.97, (10, 10, 20, 20))
    as_triangle = _detection("triangle", 7, 0.58, (12, 10, 20, 20))  # IoU 18/22
    beside = _detection("circle", 1, 0.9, (40, 10, 20, 20))  # no overlap
    half_over = _detection("circle", 1, 0.8, (20, 10, 20, 20))  # IoU 1/3 with the square
    same_class = _detection("square", 3, 0.6, (10, 11, 20, 20))  # per-class NMS's business
    unlisted = _detection("circle", 1, SHOWN_SCORE - 0.01, (10, 10, 20, 20))

    found = labelled_twice([as_triangle, beside, half_over, same_class, unlisted, square])

    assert found == [("square 0.97", "triangle 0.58"), ("square 0.60", "triangle 0.58")]
    assert labelled_twice([square, beside, unlisted]) == []


def test_the_picture_has_the_masks_of_the_listed_detections_drawn(tmp_path: Path) -> None:
    image = tmp_path / "grey.jpg"
    Image.fromarray(np.full((64, 96, 3), 128, dtype=np.uint8)).save(image)
    shown = _detection("circle", 1, 0.9, (5, 5, 20, 20))
    hidden = _detection("square", 3, 0.1, (60, 30, 20, 20))

    out = draw_demo_detections(image, [shown, hidden], tmp_path / "state" / "picture.png")

    # Enlarged 5x (96 px wide -> 480): every test pixel below is 5x its place in the image.
    drawn = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert drawn.shape == (320, 480, 3)
    changed = np.abs(drawn - 128).sum(axis=2) > 30
    assert changed[50:100, 50:100].all(), "the listed detection's mask is filled"
    assert not changed[200:240, 340:380].any(), "a detection below the threshold is not drawn"
