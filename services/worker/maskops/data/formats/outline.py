"""Mask outlines as polygons: contourpy's marching squares, then Douglas-Peucker.

The outline at the 0.5 level of the padded mask runs along the boundary pixels' outer
edges (cutting each corner pixel diagonally); holes are left out, as COCO, CVAT and Label
Studio polygons have none. contourpy (numpy only) traces; the simplification is a few
lines of numpy, written here because no library in the lock offers it (OpenCV,
scikit-image and shapely all would, at tens of megabytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from contourpy import FillType, contour_generator
from pycocotools import mask as mask_utils

DEFAULT_TOLERANCE = 1.0
"""Douglas-Peucker tolerance in pixels: outlines within a pixel of the mask's."""
RELATIVE_TOLERANCE = 0.02
"""The tolerance is at most this share of the square root of the object's area."""


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
