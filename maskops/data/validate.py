"""Turning one COCO image and its annotations into a clean shard sample, logging each fix.

Every problem found is recorded under a *kind* (the keys of ``<tag>_warnings.json``) and
either repaired or the offending item is left out; nothing is dropped silently.

Annotation kinds (values: annotation ids):
    box                 box reaches outside the image: clipped to it
    mask                mask extends more than 1 px beyond its box: kept as is
    degenerate_box      zero/negative-area (< 0.01 px wide or high inside the image) or
                        non-finite box: replaced by the mask's
                        bounding box when there is a mask, else the annotation is dropped
    degenerate_polygon  polygon with fewer than 3 points, an odd or non-finite coordinate
                        list, or zero area: that polygon is dropped
    far_polygon         polygon reaching farther beyond the image than the image's own
                        width or height: clipped to that margin before it is rasterised
                        (what lies inside the image is unchanged)
    empty_mask          masks are converted but the annotation has none (no segmentation,
                        all polygons degenerate, or nothing inside the image): dropped
    bad_mask            RLE whose size is not the image's, or whose counts are corrupt:
                        dropped
    unknown_category    category id not in ``categories``: dropped
    missing_image       ``image_id`` has no entry in ``images``: dropped (reported under
                        that image id)
Image kinds (values: short details):
    unsafe_path         ``file_name`` absolute, with ``..``, or leading out of the image
                        directory through a link: image skipped, never opened (what is
                        outside is neither read nor reported on)
    missing_file        not on disk: image skipped
    unreadable          not a regular file, larger than ``MAX_IMAGE_FILE_BYTES``, not
                        decodable, or truncated: image skipped
    exif_rotated        EXIF orientation applied, image stored upright
    color_mode          grayscale/CMYK/alpha/palette image converted to RGB (alpha is
                        composited over black)
    format              neither JPEG nor PNG: stored as PNG
    size_mismatch       width/height in the JSON disagree with the file: the file wins
    error               processing failed unexpectedly (a maskops bug; please report it
                        with the image): image skipped
Source-format kinds (datasets labelled in another tool's format, read by
:mod:`maskops.data.formats`; keyed by image id, or by the source file's name when no image
could be read from it): ``malformed_record``, ``unknown_label``, ``unsupported_shape``,
``mask_polygon_mismatch``, ``default_label``, ``beyond_limit`` (see
:mod:`maskops.data.formats.builder`).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps
from pycocotools import mask as mask_utils

from maskops.data.coco import CocoAnnotation, CocoImage
from maskops.masks import decode_rle_string
from maskops.path_rules import PathEscape, confine

ANNOTATION_KINDS = (
    "box",
    "mask",
    "degenerate_box",
    "degenerate_polygon",
    "far_polygon",
    "empty_mask",
    "bad_mask",
    "unknown_category",
    "missing_image",
)
IMAGE_KINDS = (
    "error",
    "unsafe_path",
    "missing_file",
    "unreadable",
    "exif_rotated",
    "color_mode",
    "format",
    "size_mismatch",
)
FORMAT_KINDS = (
    "malformed_record",
    "unknown_label",
    "unsupported_shape",
    "mask_polygon_mismatch",
    "default_label",
    "beyond_limit",
)
WARNING_KINDS = ANNOTATION_KINDS + IMAGE_KINDS + FORMAT_KINDS

_BOX_TOLERANCE = 0.01
"""Pixels a box may exceed the image by before it counts as out of bounds (float noise)."""
_MASK_TOLERANCE = 1.0
MAX_IMAGE_FILE_BYTES = 256 * 1024**2
"""The largest image file read (a 100 MP 16-bit PNG is about this size)."""
_EXIF_ORIENTATION = 0x0112
_JPEG_QUALITY = 95


@dataclass
class ImageOutcome:
    """What became of one image: a sample to write (or None if skipped) and the findings."""

    image_id: int
    record: dict[str, Any] | None = None
    image_bytes: bytes = b""
    image_format: str = "jpeg"
    findings: dict[str, list[Any]] = field(default_factory=dict)
    dropped_annotations: int = 0

    def note(self, kind: str, item: Any) -> None:
        self.findings.setdefault(kind, []).append(item)


def process_image(
    image: CocoImage,
    annotations: list[CocoAnnotation],
    *,
    image_dir: Path,
    labels: dict[int, int],
    include_masks: bool,
) -> ImageOutcome:
    """Validate and normalise one image and its annotations.

    Args:
        image: the ``images`` entry.
        annotations: the annotations pointing at it, in file order.
        image_dir: directory ``file_name`` is relative to.
        labels: category id -> contiguous training label.
        include_masks: whether masks are converted (else segmentations are ignored).

    Returns:
        The outcome; ``record`` is None when the image itself is unusable.
    """
    outcome = ImageOutcome(image.id)
    try:
        data = read_image_file(image_dir, image.file_name)
    except SkippedImage as exc:
        outcome.note(exc.kind, exc.detail)
        outcome.dropped_annotations = len(annotations)
        return outcome
    try:
        pil: Image.Image = Image.open(io.BytesIO(data))
        pil.load()
    except Exception as exc:  # PIL raises many types on corrupt files; none may stop a job
        outcome.note("unreadable", f"{image.file_name}: {exc}")
        outcome.dropped_annotations = len(annotations)
        return outcome

    pil, reencode = _normalise_pixels(pil, image, outcome)
    width, height = pil.size
    if (image.width, image.height) not in ((None, None), (width, height)):
        outcome.note("size_mismatch", f"json {image.width}x{image.height}, file {width}x{height}")
    # A JPEG source stays JPEG (one re-encode at high quality); anything else becomes PNG.
    fmt = "jpeg" if _is_jpeg(data) else "png"
    if reencode:
        data = _encode(pil, fmt)
    outcome.image_bytes, outcome.image_format = data, fmt

    records = []
    for ann in annotations:
        record = _annotation(ann, width, height, labels, include_masks, outcome)
        if record is None:
            outcome.dropped_annotations += 1
        else:
            records.append(record)
    outcome.record = {
        "image_id": image.id,
        "file_name": image.file_name,
        "height": height,
        "width": width,
        "sha256": hashlib.sha256(data).hexdigest(),
        "annotations": records,
    }
    return outcome


class SkippedImage(Exception):
    """An image file not read: its finding's kind and detail."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def read_image_file(image_dir: Path, file_name: str) -> bytes:
    """The bytes of ``image_dir / file_name``, a regular file inside ``image_dir`` of at
    most :data:`MAX_IMAGE_FILE_BYTES`; raises :class:`SkippedImage` (``unsafe_path``,
    ``missing_file``, ``unreadable``).

    A name that leaves the directory is refused before anything is opened or even looked
    up, so the finding is the same whether the target exists or not (annotation files
    come from clients: ``/etc/hostname`` or ``../../x`` must neither be read nor probed).
    """
    try:
        confine(image_dir, file_name)
    except PathEscape:
        raise SkippedImage("unsafe_path", file_name) from None
    except (OSError, RuntimeError) as exc:  # a link loop
        raise SkippedImage("unreadable", f"{file_name}: {exc}") from None
    path = image_dir / file_name
    try:
        # Non-blocking: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SkippedImage("missing_file", file_name) from None
    except OSError as exc:
        raise SkippedImage("unreadable", f"{file_name}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # before fdopen, which refuses a directory
        os.close(fd)
        raise SkippedImage("unreadable", f"{file_name}: not a regular file")
    with os.fdopen(fd, "rb") as source:
        # Read up to the limit only: the size may grow while reading.
        data = b"" if info.st_size > MAX_IMAGE_FILE_BYTES else source.read(MAX_IMAGE_FILE_BYTES + 1)
    if info.st_size > MAX_IMAGE_FILE_BYTES or len(data) > MAX_IMAGE_FILE_BYTES:
        raise SkippedImage(
            "unreadable", f"{file_name}: larger than the limit of {MAX_IMAGE_FILE_BYTES} bytes"
        )
    return data


def _is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


def _normalise_pixels(
    pil: Image.Image, image: CocoImage, outcome: ImageOutcome
) -> tuple[Image.Image, bool]:
    """Upright RGB pixels; True when they no longer match the source bytes."""
    reencode = False
    source_format = pil.format or "unknown"
    if source_format not in ("JPEG", "MPO", "PNG"):
        outcome.note("format", f"{source_format} stored as PNG")
        reencode = True
    orientation = pil.getexif().get(_EXIF_ORIENTATION, 1)
    if orientation not in (1, None):
        raw = pil.size
        upright = (raw[1], raw[0]) if orientation in (5, 6, 7, 8) else raw
        if (image.width, image.height) == raw and raw != upright:
            # The annotations were made on the stored pixels, not the displayed ones.
            outcome.note("exif_rotated", f"orientation {orientation} ignored: json size is raw")
        else:
            pil = ImageOps.exif_transpose(pil)
            outcome.note("exif_rotated", f"orientation {orientation} applied")
            reencode = True
    if pil.mode != "RGB":
        outcome.note("color_mode", pil.mode)
        has_alpha = pil.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
            pil.mode == "P" and "transparency" in pil.info
        )
        if has_alpha:
            rgba = pil.convert("RGBA")
            black = Image.new("RGBA", rgba.size, (0, 0, 0, 255))
            pil = Image.alpha_composite(black, rgba).convert("RGB")
        elif pil.mode in ("I;16", "I;16B", "I;16L", "I"):
            # 16-bit grayscale: scale to 8 bits instead of clipping at 255.
            array = np.asarray(pil, dtype=np.float64)
            peak = max(float(array.max()), 1.0)
            pil = Image.fromarray((array * (255.0 / peak)).astype(np.uint8)).convert("RGB")
        else:
            pil = pil.convert("RGB")
        reencode = True
    return pil, reencode


def _encode(pil: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    if fmt == "jpeg":
        pil.save(buffer, format="JPEG", quality=_JPEG_QUALITY)
    else:
        pil.save(buffer, format="PNG")
    return buffer.getvalue()


def _annotation(
    ann: CocoAnnotation,
    width: int,
    height: int,
    labels: dict[int, int],
    include_masks: bool,
    outcome: ImageOutcome,
) -> dict[str, Any] | None:
    """The shard record of one annotation, or None when it must be dropped."""
    if ann.category_id not in labels:
        outcome.note("unknown_category", ann.id)
        return None
    x, y, w, h = ann.bbox
    box: tuple[float, float, float, float] | None = None
    if all(math.isfinite(v) for v in ann.bbox) and w > 0 and h > 0:
        x0, y0 = max(0.0, x), max(0.0, y)
        x1, y1 = min(float(width), x + w), min(float(height), y + h)
        outside = (
            x < -_BOX_TOLERANCE
            or y < -_BOX_TOLERANCE
            or x + w > width + _BOX_TOLERANCE
            or y + h > height + _BOX_TOLERANCE
        )
        if outside:
            outcome.note("box", ann.id)
        # Thinner than the tolerance counts as degenerate: float32 could make it zero-width,
        # which torchvision rejects mid-training.
        if x1 - x0 > _BOX_TOLERANCE and y1 - y0 > _BOX_TOLERANCE:
            box = (x0, y0, x1, y1)

    rle: dict[str, Any] | None = None
    if include_masks:
        rle = _mask(ann, width, height, outcome)
        if rle is None:
            return None
    if box is None:
        outcome.note("degenerate_box", ann.id)
        if rle is None:
            return None
        mx, my, mw, mh = (float(v) for v in mask_utils.toBbox(rle))
        box = (mx, my, mx + mw, my + mh)
    elif rle is not None:
        mx, my, mw, mh = (float(v) for v in mask_utils.toBbox(rle))
        if (
            mx < box[0] - _MASK_TOLERANCE
            or my < box[1] - _MASK_TOLERANCE
            or mx + mw > box[2] + _MASK_TOLERANCE
            or my + mh > box[3] + _MASK_TOLERANCE
        ):
            outcome.note("mask", ann.id)

    record: dict[str, Any] = {
        "id": ann.id,
        "category_id": ann.category_id,
        "label": labels[ann.category_id],
        "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
        "iscrowd": int(ann.iscrowd),
    }
    if rle is not None:
        record["area"] = float(mask_utils.area(rle))
        record.update(_cropped_mask(rle))
    else:
        record["area"] = (box[2] - box[0]) * (box[3] - box[1])
    return record


def _mask(
    ann: CocoAnnotation, width: int, height: int, outcome: ImageOutcome
) -> dict[str, Any] | None:
    """The annotation's mask as compressed RLE at the image's size, or None (noted)."""
    seg = ann.segmentation
    rle: dict[str, Any] | None = None
    if isinstance(seg, list):
        polygons = [p for p in seg if _valid_polygon(p)]
        if len(polygons) < len(seg):
            outcome.note("degenerate_polygon", ann.id)
        clipped = [clip_polygon(p, width, height) for p in polygons]
        if any(far for _, far in clipped):
            outcome.note("far_polygon", ann.id)
        lists = [p for p, _ in clipped if len(p) >= 6]  # pycocotools wants plain lists
        if lists:
            rle = mask_utils.merge(mask_utils.frPyObjects(lists, height, width))
    elif isinstance(seg, dict):
        if seg["size"] != [height, width]:
            outcome.note("bad_mask", ann.id)
            return None
        counts = seg["counts"]
        try:
            runs = counts if isinstance(counts, list) else decode_rle_string(counts)
        except ValueError:
            runs = []
        if sum(runs) != height * width:
            outcome.note("bad_mask", ann.id)
            return None
        if isinstance(counts, list):
            rle = mask_utils.frPyObjects(seg, height, width)
        else:
            rle = {"size": [height, width], "counts": counts.encode("ascii")}
    if rle is None or mask_utils.area(rle) == 0:
        outcome.note("empty_mask", ann.id)
        return None
    return rle


def _cropped_mask(rle: dict[str, Any]) -> dict[str, Any]:
    """The mask as compressed RLE of its own bounding box: ``mask_box`` ``[x, y, w, h]``
    (integer pixels) and ``mask`` (the crop's counts string).

    Reading then decodes and resizes only the box, not a full-image mask per instance.
    """
    x, y, w, h = (int(v) for v in mask_utils.toBbox(rle))
    crop = np.asfortranarray(mask_utils.decode(rle)[y : y + h, x : x + w])
    counts: bytes = mask_utils.encode(crop)["counts"]
    return {"mask_box": [x, y, w, h], "mask": counts.decode("ascii")}


def clip_polygon(polygon: Sequence[float], width: int, height: int) -> tuple[list[float], bool]:
    """``polygon`` (``[x1, y1, x2, y2, ...]``, pixels) as a plain list, clipped to the image
    grown by its own width and height on every side when it reaches beyond that; and
    whether it did.

    pycocotools rasterises by walking every edge pixel by pixel at 5x: a vertex at 4e6 px
    costs hundreds of megabytes and one at 1e10 overflows its integers and crashes the
    process. Clipping to a convex region (Sutherland-Hodgman) keeps the part inside the
    image exactly, so the mask is the same.
    """
    points = list(zip(polygon[0::2], polygon[1::2], strict=True))
    low = (-float(width), -float(height))
    high = (2.0 * width, 2.0 * height)
    if all(low[0] <= x <= high[0] and low[1] <= y <= high[1] for x, y in points):
        return [float(v) for v in polygon], False
    for axis in (0, 1):
        points = _clip_half_plane(points, axis, low[axis], keep_above=True)
        points = _clip_half_plane(points, axis, high[axis], keep_above=False)
    return [float(v) for point in points for v in point], True


def _clip_half_plane(
    points: list[tuple[float, float]], axis: int, bound: float, *, keep_above: bool
) -> list[tuple[float, float]]:
    """The polygon's part on one side of the line ``point[axis] == bound``."""
    out: list[tuple[float, float]] = []
    for k, current in enumerate(points):
        previous = points[k - 1]
        inside = (current[axis] >= bound) == keep_above or current[axis] == bound
        was_inside = (previous[axis] >= bound) == keep_above or previous[axis] == bound
        if inside != was_inside:
            t = (bound - previous[axis]) / (current[axis] - previous[axis])
            other = previous[1 - axis] + t * (current[1 - axis] - previous[1 - axis])
            out.append((bound, other) if axis == 0 else (other, bound))
        if inside:
            out.append(current)
    return out


def _valid_polygon(polygon: Sequence[float]) -> bool:
    if len(polygon) < 6 or len(polygon) % 2 or not all(math.isfinite(v) for v in polygon):
        return False
    xs, ys = polygon[0::2], polygon[1::2]
    twice_area = sum(
        xs[i] * ys[(i + 1) % len(xs)] - xs[(i + 1) % len(xs)] * ys[i] for i in range(len(xs))
    )
    return abs(twice_area) > 1e-9
