"""What every format reader fills: a COCO instances document and the per-record findings.

A reader turns each labelled object into a polygon list or a binary mask and hands it to
:class:`CocoBuilder` with its label name. The builder owns the category ids (the user's
label list, or the names in first-seen order) and everything else the COCO conversion
then validates image by image (missing files, polygons with fewer than 3 points, boxes
outside the image) is left to :mod:`maskops.data.validate`, so each fault is reported
once, in the same warnings file, whatever the source format.

What only the source format can tell is recorded here, keyed like the warnings file (the
image id as text, or the source file's name when no image could be read from it):

    malformed_record       a record (file, line, element, task) that is not what the
                           format documents: left out, the rest converts
    unknown_label          a label the user's label list does not name: object left out
    unsupported_shape      a shape kind with no area (point, line) or not converted:
                           left out
    mask_polygon_mismatch  an object given both as a mask and as a polygon or box that
                           overlap less than :data:`MISMATCH_IOU`: the mask is kept
    default_label          an object the format gives no label (a VIA region with empty
                           ``region_attributes``): it takes :meth:`CocoBuilder.default_label`
    beyond_limit           a record beyond :mod:`maskops.data.limits`: a mask or instance
                           map of more than ``MAX_PIXELS`` (refused before it is decoded),
                           an image's objects past ``MAX_INSTANCES``, a category name
                           longer than ``MAX_LABEL_CHARS`` or past ``MAX_LABELS``: left out
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

from maskops.data.coco import DatasetError
from maskops.data.limits import MAX_INSTANCES, MAX_LABEL_CHARS, MAX_LABELS, MAX_PIXELS
from maskops.data.validate import FORMAT_KINDS, clip_polygon

__all__ = ["DEFAULT_LABEL", "FORMAT_KINDS", "BeyondLimit", "CocoBuilder", "FormatMismatch"]
DEFAULT_LABEL = "object"
"""The label of an object given none, when the user's label list is not a single name."""
MISMATCH_IOU = 0.5
"""Below this IoU a mask and the polygon or box given for the same object disagree."""

Polygon = Sequence[float]
"""``[x1, y1, x2, y2, ...]`` in pixels of the image."""


class FormatMismatch(DatasetError):
    """The annotations are not in the declared format; the message says what was expected."""


class BeyondLimit(ValueError):
    """A record beyond :mod:`maskops.data.limits` (reported as ``beyond_limit``)."""


def open_image(source: Path | IO[bytes]) -> Image.Image:
    """Pillow's ``Image.open`` (the header read, no pixel decoded), raising
    :class:`BeyondLimit` where Pillow refuses the size as a decompression bomb."""
    try:
        return Image.open(source)
    except Image.DecompressionBombError as exc:  # at MAX_PIXELS, Pillow's own threshold
        raise BeyondLimit(str(exc)) from None


def check_pixels(width: int, height: int) -> None:
    """Raise :class:`BeyondLimit` for a mask of more than ``MAX_PIXELS``, before it is
    allocated (a CVAT ``<mask>`` of a few hundred bytes may claim 20000 x 20000 pixels)."""
    if width * height > MAX_PIXELS:
        raise BeyondLimit(f"{width} x {height} pixels, above the limit of {MAX_PIXELS}")


@dataclass
class CocoBuilder:
    """Accumulates COCO images, annotations and categories, and the format's findings."""

    labels: Sequence[str] | None = None
    """The user's label list: category ``k`` (1-based) is ``labels[k-1]``; None: names
    become categories 1, 2, ... in the order they are first seen."""
    images: list[dict[str, Any]] = field(default_factory=list)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    findings: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    objects: int = 0
    """Objects handed to the builder, kept or not (a label it left out included)."""
    _category_ids: dict[str, int] = field(default_factory=dict)
    _objects_of: dict[int, int] = field(default_factory=dict)
    """Objects kept of each image id."""

    def __post_init__(self) -> None:
        if self.labels is not None:
            names = [str(n) for n in self.labels]
            if len(set(names)) != len(names) or not all(names):
                raise ValueError(f"labels must be distinct non-empty names, got {names}")
            if len(names) > MAX_LABELS or max(map(len, names), default=0) > MAX_LABEL_CHARS:
                raise ValueError(
                    f"labels: at most {MAX_LABELS} names of at most {MAX_LABEL_CHARS} characters"
                )
            self._category_ids = {name: k for k, name in enumerate(names, start=1)}

    def room(self, image_id: int) -> bool:
        """Whether the image takes one more object (at most ``MAX_INSTANCES``); the first
        one refused is reported. Readers ask before decoding an object's mask."""
        kept = self._objects_of.get(image_id, 0)
        if kept == MAX_INSTANCES:
            self.note(image_id, "beyond_limit", f"objects past {MAX_INSTANCES} left out")
            self._objects_of[image_id] = kept + 1  # reported once
        return kept < MAX_INSTANCES

    def note(self, key: str | int, kind: str, item: Any) -> None:
        """Record a finding under an image id (int) or a source file's name (str)."""
        entry = self.findings.setdefault(str(key), {"box": [], "mask": []})
        entry.setdefault(kind, []).append(item)

    def add_image(self, file_name: str, width: Any = None, height: Any = None) -> int:
        """An image; a size that is not two positive integers is a ``malformed_record`` and
        left out (the file's own size is used)."""
        image_id = len(self.images) + 1
        if (width, height) != (None, None) and not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (width, height)
        ):
            self.note(image_id, "malformed_record", f"{file_name}: size {width!r} x {height!r}")
            width = height = None
        self.images.append(
            {"id": image_id, "file_name": file_name, "width": width, "height": height}
        )
        return image_id

    @property
    def default_label(self) -> str | None:
        """The label of an object the format gives none: the user's only label, else
        :data:`DEFAULT_LABEL`; None when the user named several (it cannot be chosen)."""
        if self.labels is None:
            return DEFAULT_LABEL
        return str(self.labels[0]) if len(self.labels) == 1 else None

    def category_id(self, image_id: int, label: str) -> int | None:
        """The label's category id; None (noted as ``unknown_label``) when the user's
        label list does not name it."""
        self.objects += 1
        label = str(label).strip()
        if label in self._category_ids:
            return self._category_ids[label]
        if len(label) > MAX_LABEL_CHARS:
            self.note(image_id, "beyond_limit", f"label {label[:40]!r}...: {len(label)} chars")
            return None
        if self.labels is not None or not label:
            self.note(image_id, "unknown_label", label)
            return None
        if len(self._category_ids) == MAX_LABELS:
            self.note(image_id, "beyond_limit", f"label {label!r}: past {MAX_LABELS} labels")
            return None
        self._category_ids[label] = len(self._category_ids) + 1
        return self._category_ids[label]

    def add_polygons(
        self, image_id: int, label: str, polygons: Sequence[Polygon], *, iscrowd: bool = False
    ) -> int | None:
        """One object drawn as one or more polygons; its id, or None when left out."""
        if not self.room(image_id):
            return None
        category = self.category_id(image_id, label)
        if category is None:
            return None
        flat = [[float(v) for v in p] for p in polygons]
        # An odd coordinate list's last number is no point (validation drops that polygon).
        pairs = [
            xy
            for p in flat
            for xy in zip(p[0:-1:2], p[1::2], strict=True)
            if all(map(math.isfinite, xy))
        ]
        xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
        bbox = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)] if pairs else [0.0] * 4
        return self._add(image_id, category, bbox, flat, iscrowd)

    def add_mask(
        self,
        image_id: int,
        label: str,
        mask: np.ndarray,
        *,
        drawn_as: Polygon | None = None,
    ) -> int | None:
        """One object given as a binary mask (height x width). ``drawn_as``: the polygon
        the format also gives for it, checked against the mask."""
        if not self.room(image_id):
            return None
        category = self.category_id(image_id, label)
        if category is None:
            return None
        # No copy of a Fortran-ordered uint8 mask (readers allocate theirs so).
        rle = mask_utils.encode(np.asfortranarray(mask, dtype=np.uint8))
        height, width = (int(v) for v in rle["size"])
        if (
            drawn_as is not None
            and len(drawn_as) >= 6
            and len(drawn_as) % 2 == 0
            and all(math.isfinite(v) for v in drawn_as)
        ):
            # Clipped as the conversion clips polygons: a vertex at 1e10 crashes pycocotools.
            polygon = clip_polygon([float(v) for v in drawn_as], width, height)[0]
            iou = 0.0
            if len(polygon) >= 6:
                other = mask_utils.frPyObjects([polygon], height, width)
                iou = float(mask_utils.iou([rle], other, [0])[0][0])
            if iou < MISMATCH_IOU:
                self.note(image_id, "mask_polygon_mismatch", f"{label}: IoU {iou:.2f}")
        bbox = [float(v) for v in mask_utils.toBbox(rle)]
        segmentation = {"size": [height, width], "counts": rle["counts"].decode("ascii")}
        area = float(mask_utils.area(rle))
        return self._add(image_id, category, bbox, segmentation, False, area)

    def _add(
        self,
        image_id: int,
        category: int,
        bbox: list[float],
        segmentation: Any,
        iscrowd: bool,
        area: float | None = None,
    ) -> int:
        """``area``: the mask's pixel count; None: the box's (the COCO conversion computes
        every area again from the rasterised shape)."""
        annotation_id = len(self.annotations) + 1
        self._objects_of[image_id] = self._objects_of.get(image_id, 0) + 1
        self.annotations.append(
            {
                "id": annotation_id,
                "image_id": image_id,
                "category_id": category,
                "bbox": bbox,
                "area": float(bbox[2] * bbox[3]) if area is None else area,
                "iscrowd": int(iscrowd),
                "segmentation": segmentation,
            }
        )
        return annotation_id

    def categories(self) -> list[dict[str, Any]]:
        return [{"id": i, "name": name} for name, i in self._category_ids.items()]

    def document(self) -> dict[str, Any]:
        """The COCO instances document (images without a known size leave it out)."""
        images = [{k: v for k, v in im.items() if v is not None} for im in self.images]
        return {
            "images": images,
            "annotations": self.annotations,
            "categories": self.categories(),
        }


def rectangle(x0: float, y0: float, x1: float, y1: float) -> list[float]:
    return [x0, y0, x1, y0, x1, y1, x0, y1]


def ellipse(cx: float, cy: float, rx: float, ry: float, points: int = 32) -> list[float]:
    """An ellipse as a polygon (COCO has no curves)."""
    out: list[float] = []
    for k in range(points):
        angle = 2 * math.pi * k / points
        out += [cx + rx * math.cos(angle), cy + ry * math.sin(angle)]
    return out
