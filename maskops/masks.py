"""Instance masks as numbers: COCO RLE decoded, and outlined as polygons.

numpy and contourpy only (no pycocotools), so that the API, which has neither PIL nor
pycocotools, can answer ``/infer`` with polygons, and the data tools share the code.

Outlines are contourpy's marching squares at the 0.5 level of the padded mask: they run
along the boundary pixels' outer edges, cutting each corner pixel diagonally. Holes are
left out (COCO, CVAT and Label Studio polygons have none). Douglas-Peucker then drops
points within ``tolerance`` pixels of the outline; it is a few lines of numpy, written here
because no library in the lock offers it (OpenCV, scikit-image and shapely would, each at
tens of megabytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from contourpy import FillType, contour_generator

DEFAULT_TOLERANCE = 1.0
"""Douglas-Peucker tolerance in pixels: outlines within a pixel of the mask's."""
RELATIVE_TOLERANCE = 0.02
"""The tolerance is at most this share of the square root of the object's area: on a small
object, chords cut inside a convex outline would be a large share of its area."""


def rle_to_polygons(rle: dict[str, Any], tolerance: float = DEFAULT_TOLERANCE) -> list[list[float]]:
    """A COCO RLE mask's outer outlines as COCO polygons (largest first)."""
    return mask_outlines(rle_to_mask(rle), tolerance)


def rle_to_mask(rle: dict[str, Any]) -> np.ndarray:
    """A COCO RLE (compressed string or counts list) as a ``uint8`` height x width mask.

    Raises:
        ValueError: corrupt counts, or counts that do not cover the size.
    """
    height, width = (int(v) for v in rle["size"])
    counts = rle["counts"]
    if isinstance(counts, bytes):
        counts = counts.decode("ascii")
    runs = decode_rle_string(counts) if isinstance(counts, str) else [int(v) for v in counts]
    if sum(runs) != height * width:
        raise ValueError(f"RLE counts cover {sum(runs)} pixels, not {height} x {width}")
    flat = np.repeat(np.arange(len(runs)) % 2, runs).astype(np.uint8)
    return flat.reshape(width, height).T  # COCO runs go down the columns


def mask_outlines(mask: np.ndarray, tolerance: float = DEFAULT_TOLERANCE) -> list[list[float]]:
    """A binary mask's outer outlines as COCO polygons ``[x1, y1, ...]`` (largest first)."""
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
            # The 2-D cross product, written out: numpy 2 refuses np.cross on 2-D vectors.
            (dx, dy), rel = b - a, segment - a
            distances = np.abs(dx * rel[:, 1] - dy * rel[:, 0]) / length
        index = int(np.argmax(distances))
        if distances[index] > tolerance:
            keep[start + 1 + index] = True
            stack += [(start, start + 1 + index), (start + 1 + index, end)]
    return line[keep]


def _area(polygon: Sequence[float]) -> float:
    xs, ys = np.asarray(polygon[0::2]), np.asarray(polygon[1::2])
    return 0.5 * abs(float(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))))


def decode_rle_string(text: str) -> list[int]:
    """Run lengths of a COCO compressed-RLE string (pycocotools' rleFrString, in Python).

    pycocotools trusts the string and writes past its buffer on a corrupt one, so the
    runs are checked here first.
    """
    runs: list[int] = []
    position = 0
    while position < len(text):
        value, shift, more = 0, 0, True
        while more:
            if position >= len(text):
                raise ValueError("truncated RLE string")
            c = ord(text[position]) - 48
            if not 0 <= c < 64:
                raise ValueError(f"invalid RLE character {text[position]!r}")
            value |= (c & 0x1F) << (5 * shift)
            more = bool(c & 0x20)
            position += 1
            shift += 1
            if not more and c & 0x10:
                value |= -1 << (5 * shift)
        if len(runs) > 2:
            value += runs[-2]
        if value < 0:
            raise ValueError("negative run length")
        runs.append(value)
    return runs
