"""Predictions sent back to labelling tools as pre-annotations for review.

From an inference run's label folder (per-image COCO results with RLE masks, and
:data:`~maskops.evaluation.inference.IMAGES_INDEX`), :func:`export_predictions` writes:

    ``coco``         ``predictions_coco_polygons.json`` and ``predictions_coco_rle.json``:
                     COCO documents (images, categories, annotations with ``score``), the
                     masks as polygons or as RLE; either registers as a dataset again
    ``cvat``         ``predictions_cvat.xml``: CVAT for images 1.1, polygons with a
                     ``score`` attribute (CVAT: Upload annotations, "CVAT 1.1")
    ``labelstudio``  ``predictions_labelstudio.json``: tasks with ``predictions`` (model
                     version, per-region and per-task scores) and
                     ``labelstudio_config.xml``, the labelling interface they match

Polygons are the masks' outlines (contourpy's marching squares at the 0.5 level, so they
run through the boundary pixels' edges), simplified by Douglas-Peucker with ``tolerance``
pixels; holes are left out (COCO, CVAT and Label Studio polygons have none).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from contourpy import FillType, contour_generator
from pycocotools import mask as mask_utils

from maskops.data.formats import cvat, labelstudio

EXPORT_FORMATS = ("coco", "cvat", "labelstudio")
DEFAULT_TOLERANCE = 1.0
"""Douglas-Peucker tolerance in pixels: outlines within a pixel of the mask's."""
RELATIVE_TOLERANCE = 0.02
"""The tolerance is at most this share of the square root of the object's area."""
INDEX_FILE = "coco_images.json"
"""The inference label folder's COCO skeleton (``maskops.evaluation.inference.IMAGES_INDEX``;
the engine's data package does not import the model code)."""


def mask_to_polygons(
    rle: dict[str, Any], tolerance: float = DEFAULT_TOLERANCE
) -> list[list[float]]:
    """A mask's outer outlines as COCO polygons ``[x1, y1, ...]`` (largest first)."""
    counts = rle["counts"]
    mask = mask_utils.decode({"size": rle["size"], "counts": _bytes(counts)})
    # Simplifying cuts chords inside a convex outline: on a small object half a pixel all
    # round is a large share of its area, so the tolerance shrinks with the object's size.
    tolerance = min(tolerance, RELATIVE_TOLERANCE * float(np.sqrt(mask.sum())))
    padded = np.pad(mask.astype(np.float64), 1)
    filled = contour_generator(z=padded, fill_type=FillType.OuterOffset).filled(0.5, 2.0)
    polygons: list[list[float]] = []
    for points, offsets in zip(*filled, strict=True):
        outer = np.asarray(points[offsets[0] : offsets[1]], dtype=np.float64)
        # Padded index -> COCO pixel coordinates: pixel (r, c) spans [c, c+1) x [r, r+1).
        ring = simplify(outer[:-1] - 0.5, tolerance)
        if len(ring) >= 3:
            polygons.append([round(float(v), 2) for v in ring.reshape(-1)])
    return sorted(polygons, key=lambda p: -_area(p))


def simplify(ring: np.ndarray, tolerance: float) -> np.ndarray:
    """Douglas-Peucker on a closed ring of points (n x 2): the first point and the one
    farthest from it are kept, and each half simplified as an open line."""
    if len(ring) < 4 or tolerance <= 0:
        return ring
    far = int(np.argmax(np.hypot(*(ring - ring[0]).T)))
    first = _simplify_line(ring[: far + 1], tolerance)
    second = _simplify_line(np.vstack([ring[far:], ring[:1]]), tolerance)
    return np.vstack([first[:-1], second[:-1]])


def _simplify_line(line: np.ndarray, tolerance: float) -> np.ndarray:
    keep = np.zeros(len(line), dtype=bool)
    keep[[0, -1]] = True
    stack = [(0, len(line) - 1)]
    while stack:
        start, end = stack.pop()
        if end - start < 2:
            continue
        a, b = line[start], line[end]
        segment = line[start + 1 : end]
        length = float(np.hypot(*(b - a)))
        if length == 0:
            distances = np.hypot(*(segment - a).T)
        else:
            distances = np.abs(np.cross(b - a, segment - a)) / length
        index = int(np.argmax(distances))
        if distances[index] > tolerance:
            keep[start + 1 + index] = True
            stack += [(start, start + 1 + index), (start + 1 + index, end)]
    return line[keep]


def _area(polygon: Sequence[float]) -> float:
    xs, ys = np.asarray(polygon[0::2]), np.asarray(polygon[1::2])
    return 0.5 * abs(float(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))))


def _bytes(counts: Any) -> Any:
    return counts.encode("ascii") if isinstance(counts, str) else counts


def read_label_dir(label_dir: Path) -> dict[str, Any]:
    """An inference label folder as one COCO document, detections as annotations (RLE)."""
    index = json.loads((label_dir / INDEX_FILE).read_text())
    annotations: list[dict[str, Any]] = []
    for path in sorted(label_dir.glob("*.json")):
        if path.name == INDEX_FILE or path.name.startswith("predictions_"):
            continue
        for detection in json.loads(path.read_text()):
            annotations.append(
                {k: v for k, v in detection.items() if k != "file_name"}
                | {
                    "id": len(annotations) + 1,
                    "iscrowd": 0,
                    "area": detection["bbox"][2] * detection["bbox"][3],
                }
            )
    return {
        "images": index["images"],
        "categories": index["categories"],
        "annotations": annotations,
    }


def with_polygons(annotations: Iterable[dict[str, Any]], tolerance: float) -> list[dict[str, Any]]:
    """The annotations with their RLE masks as polygons; those whose mask has no outline
    of 3 points or more (a speck) are left out."""
    out = []
    for ann in annotations:
        segmentation = ann.get("segmentation")
        if not isinstance(segmentation, dict):
            continue
        polygons = mask_to_polygons(segmentation, tolerance)
        if polygons:
            out.append(ann | {"segmentation": polygons})
    return out


def export_predictions(
    label_dir: Path,
    out_dir: Path,
    formats: Sequence[str],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    model_version: str = "maskops",
    image_url: str = "/data/local-files/?d=",
) -> list[Path]:
    """Write the requested :data:`EXPORT_FORMATS` of an inference label folder; the files.

    Raises:
        ValueError: an unknown format name.
    """
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown:
        raise ValueError(f"export formats {unknown}: expected some of {', '.join(EXPORT_FORMATS)}")
    document = read_label_dir(label_dir)
    images, categories = document["images"], document["categories"]
    polygons = with_polygons(document["annotations"], tolerance)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def write(name: str, text: str | bytes) -> None:
        path = out_dir / name
        partial = path.with_name(path.name + ".partial")
        if isinstance(text, bytes):
            partial.write_bytes(text)
        else:
            partial.write_text(text)
        partial.replace(path)
        written.append(path)

    if "coco" in formats:
        write("predictions_coco_polygons.json", json.dumps(document | {"annotations": polygons}))
        write("predictions_coco_rle.json", json.dumps(document))
    if "cvat" in formats:
        partial = out_dir / "predictions_cvat.xml.partial"
        cvat.write(images, polygons, categories, partial)
        write("predictions_cvat.xml", partial.read_bytes())
        partial.unlink()
    if "labelstudio" in formats:
        tasks = labelstudio.tasks(
            images, polygons, categories, image_url=image_url, model_version=model_version
        )
        write("predictions_labelstudio.json", json.dumps(tasks))
        write("labelstudio_config.xml", labelstudio.labeling_config(categories))
    return written
