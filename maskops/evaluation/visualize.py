"""Drawing detections on images: boxes, class names, scores and instance masks.

Colours are saturated mid-brightness hues spaced by the golden angle, so neighbouring
instances differ and every colour stands out on dark and on light images. Label text sits
on a filled box of the instance colour, in black or white, whichever contrasts more; mask
outlines are drawn at full opacity over a semi-transparent fill.
"""

from __future__ import annotations

import colorsys
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pycocotools.mask as mask_util
from PIL import Image, ImageDraw, ImageFont

MASK_ALPHA = 0.45
"""Opacity of the mask fill."""

Colour = tuple[int, int, int]


def instance_colour(index: int) -> Colour:
    """The ``index``-th colour of a sequence of well-separated, saturated colours."""
    hue = (index * 0.618033988749895) % 1.0
    r, g, b = colorsys.hsv_to_rgb(hue, 0.85, 0.95)
    return round(r * 255), round(g * 255), round(b * 255)


def _text_colour(background: Colour) -> Colour:
    luminance = 0.299 * background[0] + 0.587 * background[1] + 0.114 * background[2]
    return (0, 0, 0) if luminance > 140 else (255, 255, 255)


@lru_cache(maxsize=8)
def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except (OSError, ImportError, TypeError):  # Pillow without FreeType: fixed bitmap font
        return ImageFont.load_default()


def _outline(mask: np.ndarray, thickness: int) -> np.ndarray:
    """Pixels of ``mask`` within ``thickness`` pixels of its edge (4-neighbourhood)."""
    inner = mask.copy()
    for _ in range(thickness):
        shrunk = inner.copy()
        shrunk[1:, :] &= inner[:-1, :]
        shrunk[:-1, :] &= inner[1:, :]
        shrunk[:, 1:] &= inner[:, :-1]
        shrunk[:, :-1] &= inner[:, 1:]
        # The image border is an edge too.
        shrunk[[0, -1], :] = False
        shrunk[:, [0, -1]] = False
        inner = shrunk
    return mask & ~inner


def draw_detections(
    image: Image.Image,
    detections: Sequence[Mapping[str, Any]],
    *,
    category_names: Mapping[int, str],
    include_mask: bool = False,
) -> Image.Image:
    """Draw COCO-format detections on a copy of an image.

    Args:
        image: the original image (any mode; drawn as RGB).
        detections: COCO results for this image: ``bbox`` ``[x, y, w, h]`` in the image's
            pixels, ``category_id``, ``score``, and ``segmentation`` (compressed RLE of
            the image's size) used when ``include_mask`` is true.
        category_names: category id -> name for the labels.
        include_mask: fill each instance's mask semi-transparently and outline it.

    Returns:
        A new RGB image of the same size.
    """
    canvas = np.asarray(image.convert("RGB"), dtype=np.float32).copy()
    height, width = canvas.shape[:2]
    thickness = max(2, round(min(height, width) / 300))
    colours = [instance_colour(i) for i in range(len(detections))]
    if include_mask:
        for det, colour in zip(detections, colours, strict=True):
            segmentation = det.get("segmentation")
            if segmentation is None:
                continue
            rle = {"size": segmentation["size"], "counts": segmentation["counts"]}
            if isinstance(rle["counts"], str):
                rle["counts"] = rle["counts"].encode("utf-8")
            mask = mask_util.decode(rle).astype(bool)
            if mask.shape != (height, width):
                raise ValueError(
                    f"segmentation of size {mask.shape} does not match the image {height}x{width}"
                )
            tint = np.asarray(colour, dtype=np.float32)
            canvas[mask] = canvas[mask] * (1.0 - MASK_ALPHA) + tint * MASK_ALPHA
            canvas[_outline(mask, max(1, thickness // 2))] = tint
    result = Image.fromarray(canvas.round().clip(0, 255).astype(np.uint8), mode="RGB")
    draw = ImageDraw.Draw(result)
    font = _font(max(12, round(min(height, width) / 40)))
    for det, colour in zip(detections, colours, strict=True):
        x, y, w, h = (float(v) for v in det["bbox"])
        draw.rectangle([x, y, x + w, y + h], outline=colour, width=thickness)
        name = category_names.get(int(det["category_id"]), str(det["category_id"]))
        text = f"{name} {float(det['score']):.2f}"
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        text_w, text_h = right - left, bottom - top
        pad = max(2, thickness)
        # Above the box when there is room, otherwise just inside its top edge.
        label_top = y - text_h - 2 * pad if y - text_h - 2 * pad >= 0 else y
        label_left = min(max(0.0, x), max(0.0, width - text_w - 2 * pad))
        draw.rectangle(
            [label_left, label_top, label_left + text_w + 2 * pad, label_top + text_h + 2 * pad],
            fill=colour,
        )
        draw.text(
            (label_left + pad - left, label_top + pad - top),
            text,
            fill=_text_colour(colour),
            font=font,
        )
    return result
