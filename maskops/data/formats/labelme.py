"""LabelMe: one JSON file per image, in a folder (searched recursively) or a single file.

Layout (labelme's own files): ``{"version", "shapes": [{"label", "points": [[x, y], ...],
"shape_type", "group_id", "mask"}], "imagePath", "imageHeight", "imageWidth"}``. Shape
types ``polygon`` (also a missing ``shape_type``), ``rectangle`` (two corners), ``circle``
(centre and a point on the circle) and ``mask`` (a base64 PNG of the rectangle spanned by
its two points) are objects; ``point``, ``line``, ``linestrip`` have no area. Shapes of an
image with the same label and ``group_id`` are one object (labelme's grouping).

``imagePath`` is taken by its base name under the image folder (labelme writes it relative
to the JSON file, often ``../images/x.jpg``). A file that is not JSON or has no ``shapes``
is reported under its own name and the others convert.
"""

from __future__ import annotations

import base64
import io
import json
import math
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from maskops.data.formats.builder import (
    BeyondLimit,
    CocoBuilder,
    FormatMismatch,
    check_pixels,
    open_image,
    rectangle,
)

EXPECTED = "LabelMe JSON files (one per image, with 'shapes' and 'imagePath')"


def read(annotations: Path, builder: CocoBuilder) -> None:
    files = sorted(annotations.rglob("*.json")) if annotations.is_dir() else [annotations]
    files = [f for f in files if f.is_file()]  # a FIFO would block the read
    readable = 0
    for path in files:
        name = path.relative_to(annotations).as_posix() if annotations.is_dir() else path.name
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(document, dict) or not isinstance(document.get("shapes"), list):
                raise ValueError("no 'shapes' list")
            image_path = str(document["imagePath"])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, RecursionError) as exc:
            builder.note(name, "malformed_record", f"{name}: {exc}")  # RecursionError: too deep
            continue
        readable += 1
        _image(builder, document, image_path)
    if not readable:
        raise FormatMismatch(f"{annotations.name}: expected {EXPECTED}; none found")


def _image(builder: CocoBuilder, document: dict[str, Any], image_path: str) -> None:
    file_name = PurePosixPath(image_path.replace("\\", "/")).name
    # A size that is not two positive integers is reported by the builder and left out.
    image_id = builder.add_image(file_name, document.get("imageWidth"), document.get("imageHeight"))
    width, height = builder.images[-1]["width"], builder.images[-1]["height"]
    objects: dict[object, tuple[str, list[list[float]]]] = {}
    for index, shape in enumerate(document["shapes"]):
        try:
            label = str(shape["label"])
            group = shape.get("group_id")
            if not isinstance(group, int | float | str | None):
                raise TypeError(f"group_id: expected a number, got {group!r}")
            kind = shape.get("shape_type") or "polygon"
            points = [(float(x), float(y)) for x, y in shape["points"]]
            if kind == "mask":
                if width is None or height is None:
                    raise ValueError("a mask shape needs imageWidth and imageHeight")
                if builder.room(image_id):  # asked first: the mask is decoded at full size
                    mask, box = _mask(shape["mask"], points, height, width)
                    builder.add_mask(image_id, label, mask, drawn_as=box)
                continue
            polygon = _polygon(kind, points)
        except BeyondLimit as exc:
            builder.note(image_id, "beyond_limit", f"shapes[{index}]: {exc}")
            continue
        except (KeyError, TypeError, ValueError, OSError) as exc:
            builder.note(image_id, "malformed_record", f"shapes[{index}]: {exc!r}")
            continue
        if polygon is None:
            builder.note(image_id, "unsupported_shape", kind)
            continue
        key = (label, group) if group is not None else index
        objects.setdefault(key, (label, []))[1].append(polygon)
    for label, polygons in objects.values():
        builder.add_polygons(image_id, label, polygons)


def _polygon(kind: str, points: list[tuple[float, float]]) -> list[float] | None:
    if kind == "polygon":
        return [v for xy in points for v in xy]
    if kind == "rectangle" and len(points) == 2:
        (x0, y0), (x1, y1) = points
        return rectangle(min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
    if kind == "circle" and len(points) == 2:
        (cx, cy), (px, py) = points
        r = math.hypot(px - cx, py - cy)
        return [
            v
            for k in range(32)
            for v in (
                cx + r * math.cos(2 * math.pi * k / 32),
                cy + r * math.sin(2 * math.pi * k / 32),
            )
        ]
    return None


def _mask(
    data: str, points: list[tuple[float, float]], height: int, width: int
) -> tuple[np.ndarray, list[float]]:
    """labelme's mask shape: a PNG of the box from ``points[0]`` to ``points[1]``, placed
    in a full-image mask (Fortran order, as pycocotools encodes it); also that box as a
    polygon. Raises :class:`BeyondLimit` before decoding more than the pixel limit."""
    (x0, y0), (x1, y1) = points[:2]
    check_pixels(width, height)
    crop = np.asarray(open_image(io.BytesIO(base64.b64decode(data))).convert("L")) > 0
    full = np.zeros((height, width), dtype=np.uint8, order="F")
    left, top = round(min(x0, x1)), round(min(y0, y1))
    part = crop[: max(0, height - top), : max(0, width - left)]
    full[top : top + part.shape[0], left : left + part.shape[1]] = part
    box = rectangle(min(x0, x1), min(y0, y1), max(x0, x1) + 1, max(y0, y1) + 1)
    return full, box


def write(document: dict[str, Any], folder: Path, image_prefix: str = "") -> None:
    """A COCO document (polygon segmentations) as one LabelMe JSON per image."""
    folder.mkdir(parents=True, exist_ok=True)
    names = {c["id"]: c["name"] for c in document["categories"]}
    by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in document["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    for image in document["images"]:
        shapes = [
            {
                "label": names[ann["category_id"]],
                "points": [list(xy) for xy in zip(polygon[0::2], polygon[1::2], strict=True)],
                "group_id": ann["id"] if len(ann["segmentation"]) > 1 else None,
                "shape_type": "polygon",
                "flags": {},
            }
            for ann in by_image.get(image["id"], [])
            for polygon in ann["segmentation"]
        ]
        record = {
            "version": "5.5.0",
            "flags": {},
            "shapes": shapes,
            "imagePath": image_prefix + image["file_name"],
            "imageData": None,
            "imageHeight": image["height"],
            "imageWidth": image["width"],
        }
        stem = PurePosixPath(image["file_name"]).stem
        (folder / f"{stem}.json").write_text(json.dumps(record, indent=1))
