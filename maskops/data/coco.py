"""Reading a COCO instances file into typed records, with structural errors named precisely.

Only the *structure* is checked here (types, required keys, duplicate ids): a file that
fails is malformed and nothing can be converted, so :class:`DatasetError` names the file,
the key and the index (``train.json: annotations[12].bbox: expected 4 numbers``). Content
problems that leave the rest usable (boxes outside the image, unknown categories, degenerate
polygons...) are findings of the conversion, not errors; see :mod:`maskops.data.convert`.
"""

from __future__ import annotations

import contextlib
import json
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DatasetError(ValueError):
    """The dataset cannot be used at all; the message is one line naming what is wrong."""


Segmentation = list[Sequence[float]] | dict[str, Any] | None
"""Polygons ``[[x1, y1, x2, y2, ...], ...]``, an RLE dict, or None (no mask given)."""


@dataclass(frozen=True)
class CocoImage:
    id: int
    file_name: str
    width: int | None
    height: int | None


@dataclass(frozen=True)
class CocoAnnotation:
    id: int
    image_id: int
    category_id: int
    bbox: tuple[float, float, float, float]
    """``[x, y, w, h]`` in pixels, as written (may be out of bounds or degenerate)."""
    iscrowd: bool
    segmentation: Segmentation


@dataclass
class CocoFile:
    images: list[CocoImage]
    annotations: list[CocoAnnotation]
    categories: list[dict[str, Any]]
    has_annotations: bool
    """False for an unlabelled split (no ``annotations`` key at all)."""
    annotations_by_image: dict[int, list[CocoAnnotation]] = field(default_factory=dict)


def load_coco(path: Path) -> CocoFile:
    """Parse and structurally validate a COCO instances JSON file.

    Raises:
        DatasetError: unreadable file, invalid JSON (line and column), a missing or
            mistyped key (key and index), duplicate image or category ids.
    """
    name = path.name
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{name}: not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    try:
        document = json.loads(text, object_hook=_compact_polygons)
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"{name}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except RecursionError as exc:  # nested deeper than the parser's recursion allows
        raise DatasetError(f"{name}: invalid JSON: {exc}") from None
    del text  # only the parsed document is needed from here on
    if not isinstance(document, dict):
        raise DatasetError(f"{name}: top level must be an object, got {_kind(document)}")
    for key in ("images", "categories"):
        if key not in document:
            raise DatasetError(f"{name}: missing key {key!r}")
    images = [_image(name, i, d) for i, d in enumerate(_list(name, "images", document))]
    categories = [_category(name, i, d) for i, d in enumerate(_list(name, "categories", document))]
    if not categories:
        raise DatasetError(f"{name}: categories: empty (at least one category is needed)")
    has_annotations = "annotations" in document
    annotations = (
        [_annotation(name, i, d) for i, d in enumerate(_list(name, "annotations", document))]
        if has_annotations
        else []
    )
    _unique(name, "images", [im.id for im in images])
    _unique(name, "categories", [int(c["id"]) for c in categories])
    by_image: dict[int, list[CocoAnnotation]] = {}
    for ann in annotations:
        by_image.setdefault(ann.image_id, []).append(ann)
    return CocoFile(images, annotations, categories, has_annotations, by_image)


def _list(name: str, key: str, document: dict[str, Any]) -> list[Any]:
    value = document[key]
    if not isinstance(value, list):
        raise DatasetError(f"{name}: {key}: expected a list, got {_kind(value)}")
    return value


def _unique(name: str, key: str, ids: list[int]) -> None:
    seen: dict[int, int] = {}
    for index, value in enumerate(ids):
        if value in seen:
            raise DatasetError(
                f"{name}: {key}[{index}].id: duplicate id {value} (also {key}[{seen[value]}])"
            )
        seen[value] = index


def _obj(name: str, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DatasetError(f"{name}: {where}: expected an object, got {_kind(value)}")
    return value


def _int(name: str, where: str, entry: dict[str, Any], key: str, default: int | None = None) -> int:
    if key not in entry:
        if default is not None:
            return default
        raise DatasetError(f"{name}: {where}: missing key {key!r}")
    value = entry[key]
    # Some tools write integral ids as floats (3.0); anything else is malformed.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise DatasetError(f"{name}: {where}.{key}: expected an integer, got {value!r}")
    return value


def _image(name: str, index: int, value: Any) -> CocoImage:
    where = f"images[{index}]"
    entry = _obj(name, where, value)
    file_name = entry.get("file_name")
    if not isinstance(file_name, str) or not file_name:
        raise DatasetError(f"{name}: {where}.file_name: expected a non-empty string")
    sizes: dict[str, int | None] = {}
    for key in ("width", "height"):
        if entry.get(key) is None:
            sizes[key] = None
            continue
        size = _int(name, where, entry, key)
        if size <= 0:
            raise DatasetError(f"{name}: {where}.{key}: must be positive, got {size}")
        sizes[key] = size
    return CocoImage(_int(name, where, entry, "id"), file_name, sizes["width"], sizes["height"])


def _category(name: str, index: int, value: Any) -> dict[str, Any]:
    where = f"categories[{index}]"
    entry = _obj(name, where, value)
    category_id = _int(name, where, entry, "id")
    label = entry.get("name", str(category_id))
    if not isinstance(label, str):
        raise DatasetError(f"{name}: {where}.name: expected a string, got {label!r}")
    return {"id": category_id, "name": label}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    """An integer, or a float holding one (``480.0``): not ``inf``, NaN or ``48.5``."""
    return _number(value) and math.isfinite(value) and float(value).is_integer()


def _annotation(name: str, index: int, value: Any) -> CocoAnnotation:
    where = f"annotations[{index}]"
    entry = _obj(name, where, value)
    bbox = entry.get("bbox")
    if not isinstance(bbox, list) or len(bbox) != 4 or not all(_number(v) for v in bbox):
        raise DatasetError(f"{name}: {where}.bbox: expected 4 numbers [x, y, w, h], got {bbox!r}")
    iscrowd = _int(name, where, entry, "iscrowd", default=0)
    if iscrowd not in (0, 1):
        raise DatasetError(f"{name}: {where}.iscrowd: expected 0 or 1, got {iscrowd}")
    return CocoAnnotation(
        id=_int(name, where, entry, "id"),
        image_id=_int(name, where, entry, "image_id"),
        category_id=_int(name, where, entry, "category_id"),
        bbox=(float(bbox[0]), float(bbox[1]), float(bbox[2]), float(bbox[3])),
        iscrowd=bool(iscrowd),
        segmentation=_segmentation(name, f"{where}.segmentation", entry.get("segmentation")),
    )


def _segmentation(name: str, where: str, value: Any) -> Segmentation:
    if value is None or value == []:
        return None
    if isinstance(value, list):
        for k, polygon in enumerate(value):
            if isinstance(polygon, array):
                continue  # compacted while parsing: numbers only
            if not isinstance(polygon, list) or not all(_number(v) for v in polygon):
                raise DatasetError(f"{name}: {where}[{k}]: expected a list of numbers")
        return value
    if isinstance(value, dict):
        size, counts = value.get("size"), value.get("counts")
        if not (isinstance(size, list) and len(size) == 2 and all(_whole(v) for v in size)):
            raise DatasetError(f"{name}: {where}.size: expected [height, width], got {size!r}")
        if isinstance(counts, list):
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
                raise DatasetError(f"{name}: {where}.counts: expected non-negative integers")
        elif not isinstance(counts, str):
            raise DatasetError(f"{name}: {where}.counts: expected a list or an RLE string")
        return {"size": [int(size[0]), int(size[1])], "counts": counts}
    raise DatasetError(f"{name}: {where}: expected polygons or an RLE object, got {_kind(value)}")


def _compact_polygons(entry: dict[str, Any]) -> dict[str, Any]:
    """``json`` object hook: polygon coordinates become ``array("d")`` as each annotation is
    parsed (8 bytes a number instead of a ~32-byte float object and its list slot), since
    the parsed annotations are most of a conversion's memory. What does not convert stays
    as parsed, for validation to report with its index."""
    segmentation = entry.get("segmentation")
    if isinstance(segmentation, list) and all(isinstance(p, list) for p in segmentation):
        with contextlib.suppress(TypeError):
            entry["segmentation"] = [array("d", polygon) for polygon in segmentation]
    return entry


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return type(value).__name__
