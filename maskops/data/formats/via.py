"""VGG Image Annotator (VIA 2.x, also 1.x): ``via_region_data.json`` or a VIA project file.

Layout (VIA's "Export Annotations (as json)"): an object keyed ``<filename><size>``, each
value ``{"filename", "size", "regions": [...], "file_attributes"}``; VIA 1.x writes
``regions`` as an object ``{"0": region, ...}``; a saved project nests the same object
under ``_via_img_metadata``. A region is ``{"shape_attributes": {"name": "polygon",
"all_points_x": [...], "all_points_y": [...]}, "region_attributes": {...}}``; shapes
``polygon``, ``polyline``, ``rect`` (x, y, width, height), ``circle`` (cx, cy, r) and
``ellipse`` (cx, cy, rx, ry) become polygons; ``point`` has no area.

The label is the region attribute named ``label``, ``name``, ``class`` or ``type`` (the
first present), else the only attribute; a checkbox/dropdown attribute (an object
``{"cat": true}``) gives its selected key. A region without one (VIA projects of one class
leave ``region_attributes`` empty) takes the builder's default label, the single name of
the user's label list or else ``object``, and is reported as ``default_label``. VIA has
one region per shape and no notion of an object in several parts: regions of an image
that share a ``group_id`` attribute (as LabelMe's ``group_id``) and a label are one
object, which is how maskops writes an occluded object. VIA stores no image size: it is
read from the image file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from maskops.data.formats.builder import CocoBuilder, FormatMismatch, ellipse, rectangle

EXPECTED = "a VIA JSON export (an object of images, each with 'filename' and 'regions')"
_LABEL_KEYS = ("label", "name", "class", "type")


def read(annotations: Path, builder: CocoBuilder) -> None:
    document = _load(annotations)
    for key, entry in document.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("filename"), str)
            or not entry["filename"]
        ):
            builder.note(annotations.name, "malformed_record", f"{key}: no 'filename'")
            continue
        image_id = builder.add_image(entry["filename"])
        objects: dict[object, tuple[str, list[list[float]]]] = {}
        for index, region in _regions(entry.get("regions")):
            try:
                polygon = _polygon(region["shape_attributes"])
                attributes = region.get("region_attributes") or {}
                if not isinstance(attributes, dict):
                    raise TypeError(f"region_attributes: expected an object, got {attributes!r}")
                label = _label(attributes)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                builder.note(image_id, "malformed_record", f"regions[{index}]: {exc!r}")
                continue
            if isinstance(polygon, str):
                builder.note(image_id, "unsupported_shape", polygon)
                continue
            if not label and builder.default_label is not None:
                label = builder.default_label
                builder.note(image_id, "default_label", f"regions[{index}]: {label}")
            group = attributes.get("group_id")
            object_key = (label, str(group)) if group not in (None, "") else index
            objects.setdefault(object_key, (label, []))[1].append(polygon)
        for label, polygons in objects.values():
            builder.add_polygons(image_id, label, polygons)


def _load(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # too deep
        raise FormatMismatch(f"{path.name}: expected {EXPECTED}: not JSON ({exc})") from None
    if isinstance(document, dict) and isinstance(document.get("_via_img_metadata"), dict):
        document = document["_via_img_metadata"]
    if not isinstance(document, dict) or not any(
        isinstance(v, dict) and "regions" in v for v in document.values()
    ):
        raise FormatMismatch(f"{path.name}: expected {EXPECTED}")
    return document


def _regions(regions: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(regions, dict):  # VIA 1.x
        yield from regions.items()
    elif isinstance(regions, list):
        yield from enumerate(regions)


def _polygon(shape: dict[str, Any]) -> list[float] | str:
    """The shape as a polygon, or the name of a shape kind that has none."""
    kind = shape.get("name")
    if kind in ("polygon", "polyline"):
        xs, ys = shape["all_points_x"], shape["all_points_y"]
        if len(xs) != len(ys):
            raise ValueError("all_points_x and all_points_y differ in length")
        polygon = [float(v) for xy in zip(xs, ys, strict=True) for v in xy]
    elif kind == "rect":
        x, y = float(shape["x"]), float(shape["y"])
        polygon = rectangle(x, y, x + float(shape["width"]), y + float(shape["height"]))
    elif kind == "circle":
        r = float(shape["r"])
        polygon = ellipse(float(shape["cx"]), float(shape["cy"]), r, r)
    elif kind == "ellipse":
        polygon = ellipse(
            float(shape["cx"]), float(shape["cy"]), float(shape["rx"]), float(shape["ry"])
        )
    else:
        return str(kind)
    return polygon


def _label(attributes: dict[str, Any]) -> str:
    key = next((k for k in _LABEL_KEYS if k in attributes), None)
    others = [k for k in attributes if k != "group_id"]
    if key is None and len(others) == 1:
        key = others[0]
    value = attributes.get(key, "") if key is not None else ""
    if isinstance(value, dict):  # checkbox / dropdown: {"option": true}
        value = next((k for k, on in value.items() if on), "")
    return str(value)


def write(document: dict[str, Any], path: Path) -> None:
    """A COCO document (polygon segmentations) as VIA 2.x ``via_region_data.json``."""
    names = {c["id"]: c["name"] for c in document["categories"]}
    by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in document["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    out: dict[str, Any] = {}
    for image in document["images"]:
        regions = [
            {
                "shape_attributes": {
                    "name": "polygon",
                    "all_points_x": list(polygon[0::2]),
                    "all_points_y": list(polygon[1::2]),
                },
                "region_attributes": {"label": names[ann["category_id"]]}
                | ({"group_id": str(ann["id"])} if len(ann["segmentation"]) > 1 else {}),
            }
            for ann in by_image.get(image["id"], [])
            for polygon in ann["segmentation"]
        ]
        out[f"{image['file_name']}-1"] = {
            "filename": image["file_name"],
            "size": -1,
            "regions": regions,
            "file_attributes": {},
        }
    path.write_text(json.dumps(out))
