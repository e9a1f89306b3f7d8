"""The served ensemble's pre- and post-processing with numpy, Pillow and pycocotools only.

:func:`maskops.serving.repository.publish` copies this file next to every ``model.py`` of
the ensemble (``<part>/<version>/maskops_serving_ops.py``), and each model loads it from its
own directory: the Triton image installs only the ``triton`` extra (numpy, Pillow,
pycocotools, onnxruntime), never torch nor the maskops engine. So this module imports
nothing else from maskops and must stay self-contained.

It reproduces the engine's in-process path (the reference, checked by
tests/unit/serving/test_serving_ops_parity.py):

- :func:`preprocess` = ``maskops.evaluation.images.read_image`` +
  ``maskops.data.transforms.resize_and_pad``. The resize is torch's uint8 antialiased
  bilinear kernel (``F.interpolate(..., antialias=True)`` on uint8, itself Pillow's
  algorithm with int16 fixed-point weights) re-done in integer numpy, so it is bit-exact,
  where ``PIL.Image.resize`` (22-bit weights) differs by one grey level on ~3% of pixels.
  One exception: an image much larger than the model's input is reduced before resizing
  (JPEGs decoded reduced, :data:`DRAFT_MARGIN`; then any image box-averaged by whole
  factors, :data:`REDUCE_MARGIN`), within a few grey levels of the engine's full-size
  resize and in a fraction of its time and memory (a 17 MP photo for a 128 px model:
  0.1 s and +3 MB instead of 3.7 s and +230 MB); preprocessing then costs in proportion
  to the output, not to the input's sides.
- :func:`detections_to_coco` = ``maskops.evaluation.postprocess.detections_to_coco`` plus
  the ``category_name`` the API adds. The mask paste reproduces torch's float32 bilinear
  ``F.interpolate`` including where the compiled kernel fuses multiply-adds; the few values
  it still misses differ by one float32 ulp, which flips a pixel only when its probability
  is within 1e-7 of the 0.5 threshold.

Tensor names are those of :mod:`maskops.serving.protocol` (a test checks they agree).

It is also the one home of the numpy helpers the engine shares with it (the engine imports
them from here, never the other way): :func:`to_rgb` and :data:`IMAGE_FORMATS`
(``maskops.evaluation.images``), :func:`fit_scale` and :func:`resized_hw`
(``maskops.data.transforms``), and the RLE counting :func:`runs_to_counts`,
:func:`crop_to_counts` and :func:`compress_counts` (``maskops.evaluation.postprocess``).
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pycocotools.mask as mask_util
from PIL import Image, ImageOps, UnidentifiedImageError

IMAGE_BYTES = "image_bytes"
SCORE_THRESHOLD = "score_threshold"
DETECTIONS_JSON = "detections_json"
NET_INPUT = "images"
NET_OUTPUTS: tuple[str, ...] = ("boxes", "scores", "labels", "masks", "num_detections")
SCALE = "scale"
ORIG_HW = "orig_hw"

IMAGE_FORMATS: frozenset[str] = frozenset({"JPEG", "PNG", "MPO"})
"""PIL format names accepted (MPO is what PIL calls JPEGs from many phone cameras)."""

RLE = dict[str, Any]
"""A compressed COCO RLE: ``{"size": [h, w], "counts": str}``."""

_MASK_PADDING = 1
"""Pixels of zero padding around each mask map, as torchvision's ``expand_masks``."""


class ImageDecodeError(ValueError):
    """Bytes that are not a readable JPEG/PNG (the message names the image).

    The client maps "unreadable image" / "not supported" answers to a 400.
    """


# --------------------------------------------------------------------------- decoding


DRAFT_MARGIN = 2
"""A JPEG is decoded reduced (1/2, 1/4 or 1/8, by libjpeg's DCT scaling) only down to this
many times the size it is resized to: the antialiased resize then still averages at least
2 x 2 decoded pixels per output pixel, which keeps the result within a few grey levels of
resizing the full decode (tests/unit/serving/test_serving_ops_parity.py)."""

REDUCE_MARGIN = 4
"""Decoded images are box-averaged by whole factors only down to this many times the size
they are resized to (:func:`_reduce`): the antialiased resize then still sees at least
4 x 4 pixels per output pixel (within 5 grey levels, 0.25 on average, of resizing the full
image on noise; 2 x 2 gave 7)."""

_EXIF_ORIENTATION = 0x0112
_TRANSPOSED_ORIENTATIONS = frozenset({5, 6, 7, 8})
"""EXIF orientations that swap width and height."""


def load_rgb(
    data: bytes, *, name: str = "image", fit: tuple[int, int] | None = None
) -> tuple[np.ndarray, tuple[int, int]]:
    """Decode JPEG/PNG bytes into an upright RGB ``[H, W, 3]`` uint8 array.

    EXIF orientation is applied; palette, grey, 16-bit, CMYK and alpha images become 8-bit
    RGB (alpha dropped, not composited), exactly as the engine's ``load_rgb``.

    Args:
        fit: the (H, W) the image will be resized to fit. A JPEG at least twice
            ``DRAFT_MARGIN`` times larger is decoded reduced (Pillow's ``draft``): a 50 MP
            photo for a 512 px model never exists in memory at full size; any image still
            ``REDUCE_MARGIN`` times larger is then box-reduced (:func:`_reduce`).

    Returns:
        (the RGB array, possibly reduced; the upright image's full (height, width)).

    Raises:
        ImageDecodeError: unreadable, truncated, or not a JPEG/PNG.
    """
    try:
        with warnings.catch_warnings():
            # Large photos are fine (PIL still refuses real decompression bombs, > 179 MP).
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                if image.format not in IMAGE_FORMATS:
                    raise ImageDecodeError(
                        f"{name}: {image.format} images are not supported (JPEG or PNG expected)"
                    )
                full_hw = _upright_hw(image)
                if fit is not None:
                    _draft(image, full_hw, fit)
                image.load()
                turned: Image.Image = image
                if image.getexif().get(_EXIF_ORIENTATION, 1) != 1:
                    turned = ImageOps.exif_transpose(image)  # a copy: only when it turns
                upright = to_rgb(turned)
                if fit is not None:
                    upright = _reduce(upright, full_hw, fit)
                return np.asarray(upright, dtype=np.uint8), full_hw
    except ImageDecodeError:
        raise
    except (
        UnidentifiedImageError,
        OSError,
        SyntaxError,
        ValueError,
        Image.DecompressionBombError,
    ) as exc:
        raise ImageDecodeError(f"{name}: unreadable image ({exc})") from None


def _upright_hw(image: Image.Image) -> tuple[int, int]:
    width, height = image.size
    if image.getexif().get(_EXIF_ORIENTATION) in _TRANSPOSED_ORIENTATIONS:
        width, height = height, width
    return height, width


def _draft(image: Image.Image, full_hw: tuple[int, int], fit: tuple[int, int]) -> None:
    """Ask the JPEG decoder for the smallest reduction that stays ``DRAFT_MARGIN`` times
    the resized size (a no-op for PNG, and for JPEGs not much larger than ``fit``)."""
    new_h, new_w = resized_hw(*full_hw, fit)
    wanted = (DRAFT_MARGIN * new_w, DRAFT_MARGIN * new_h)  # (width, height) upright
    if image.size != (full_hw[1], full_hw[0]):  # stored sideways: EXIF rotates it
        wanted = (wanted[1], wanted[0])
    image.draft(None, wanted)


def _reduce(image: Image.Image, full_hw: tuple[int, int], fit: tuple[int, int]) -> Image.Image:
    """Box-average by whole factors, per axis, down to no less than ``REDUCE_MARGIN`` times
    the resized size: what ``draft`` does for JPEGs, for every image (PNG, and JPEGs past
    libjpeg's 1/8). The antialiased resize after it then costs in proportion to the output
    (a 7000 x 7000 PNG for a 512 px model: 17 s without, well under a second with; a
    1 x 50,000,000 PNG: its weights alone took 1.8 GB)."""
    new_h, new_w = resized_hw(*full_hw, fit)
    factor_x = max(1, image.width // (REDUCE_MARGIN * new_w))
    factor_y = max(1, image.height // (REDUCE_MARGIN * new_h))
    if factor_x == factor_y == 1:
        return image
    return image.reduce((factor_x, factor_y))


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB from any mode: 16/32-bit grey scaled (not clipped) to 8 bits, a palette's
    transparency through RGBA, alpha dropped (detection looks at the stored colours)."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16/32-bit grey: scale to 8 bits rather than let PIL clip at 255.
        array = np.asarray(image, dtype=np.float64)
        peak = array.max() if array.size else 0.0
        scaled = array * (255.0 / peak) if peak > 255 else array
        image = Image.fromarray(scaled.clip(0, 255).astype(np.uint8), mode="L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert("RGB")


# --------------------------------------------------------------------------- resizing


def fit_scale(height: int, width: int, image_size: tuple[int, int]) -> float:
    """The factor that makes an ``height x width`` image fit inside ``image_size`` (H, W)."""
    return min(image_size[0] / height, image_size[1] / width)


def resized_hw(height: int, width: int, image_size: tuple[int, int]) -> tuple[int, int]:
    """The (height, width) an image occupies inside ``image_size`` after resizing."""
    scale = fit_scale(height, width, image_size)
    return (
        min(image_size[0], max(1, round(height * scale))),
        min(image_size[1], max(1, round(width * scale))),
    )


def _aa_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Antialiased bilinear taps of one axis as torch's uint8 kernel computes them.

    Float weights in double (Pillow's ``precompute_coeffs``: a triangle filter widened by
    the downscale factor, normalised per output pixel), then rounded to int16 with the
    most fractional bits that keep the largest weight below 2**15.

    Returns:
        (``[out, K]`` int64 source indices, ``[out, K]`` int32 weights (0 past each
        pixel's taps), the number of fractional bits).
    """
    scale = in_size / out_size
    support = scale if scale >= 1.0 else 1.0  # interp_size 2 * 0.5, widened when shrinking
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    taps = int(np.ceil(support)) * 2 + 1
    index = np.zeros((out_size, taps), dtype=np.int64)
    weights = np.zeros((out_size, taps), dtype=np.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        xmin = max(int(center - support + 0.5), 0)
        xsize = min(max(min(int(center + support + 0.5), in_size) - xmin, 0), taps)
        # Sequential double arithmetic, in the kernel's order, so the weights are equal.
        w = [max(0.0, 1.0 - abs((j + xmin - center + 0.5) * invscale)) for j in range(xsize)]
        total = 0.0
        for value in w:
            total += value
        if total != 0.0:
            w = [value / total for value in w]
        index[i, :xsize] = np.arange(xmin, xmin + xsize)
        weights[i, :xsize] = w
    peak = float(weights.max()) if weights.size else 0.0
    precision = 0
    while precision < 22 and int(0.5 + peak * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    fixed = np.trunc(0.5 + weights * (1 << precision)).astype(np.int32)
    return index, fixed, precision


def _resample_axis(image: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """One separable pass of the uint8 antialiased bilinear resize along ``axis``.

    Integer arithmetic as torch's kernel: int32 sums of uint8 x int16 products, rounding
    offset ``2**(p-1)``, arithmetic shift by ``p``, clamped to 0..255.
    """
    index, weights, precision = _aa_weights(image.shape[axis], out_size)
    source = np.moveaxis(image, axis, 0)
    acc = np.full((out_size, *source.shape[1:]), 1 << (precision - 1), dtype=np.int32)
    extra = (1,) * (source.ndim - 1)
    for k in range(index.shape[1]):
        acc += source[index[:, k]].astype(np.int32) * weights[:, k].reshape(-1, *extra)
    out = np.clip(acc >> precision, 0, 255).astype(np.uint8)
    return np.moveaxis(out, 0, axis)


def resize_uint8(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize ``[H, W, C]`` uint8 to ``size`` (h, w): torch's uint8 antialiased bilinear.

    Horizontal pass first, then vertical, each skipped when that side keeps its length
    (uint8 in between, as in torch).
    """
    out = image
    if size[1] != image.shape[1]:
        out = _resample_axis(out, size[1], axis=1)
    if size[0] != image.shape[0]:
        out = _resample_axis(out, size[0], axis=0)
    return out


def resize_and_pad(
    image: np.ndarray, image_size: tuple[int, int], full_hw: tuple[int, int] | None = None
) -> tuple[np.ndarray, float]:
    """Resize ``[H, W, 3]`` uint8 keeping the aspect ratio to fit ``image_size``, then pad.

    ``full_hw``: the original size when ``image`` was decoded reduced (see
    :func:`load_rgb`); the output size and the scale are those of the original.

    Returns:
        (``[3, image_size[0], image_size[1]]`` float32 in 0..1, zero-padded bottom/right;
        ``scale``, which maps original pixel coordinates to the returned frame).
    """
    height, width = full_hw or (int(image.shape[0]), int(image.shape[1]))
    scale = fit_scale(height, width, image_size)
    new_h, new_w = resized_hw(height, width, image_size)
    resized = resize_uint8(image, (new_h, new_w)) if (new_h, new_w) != image.shape[:2] else image
    out = np.zeros((3, *image_size), dtype=np.float32)
    out[:, :new_h, :new_w] = resized.transpose(2, 0, 1)
    out[:, :new_h, :new_w] /= np.float32(255.0)
    return out, scale


def preprocess(
    data: bytes, image_size: tuple[int, int], *, name: str = "image"
) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Encoded image -> (float32 ``[3, H, W]`` network input, scale, original (h, w)).

    Raises:
        ImageDecodeError: not a decodable JPEG/PNG (message names ``name``).
    """
    image, orig_hw = load_rgb(data, name=name, fit=image_size)
    tensor, scale = resize_and_pad(image, image_size, orig_hw)
    return tensor, float(scale), orig_hw


# --------------------------------------------------------------------------- mask pasting


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a * b + c`` rounded once, as a fused multiply-add.

    float32 products are exact in float64, so one float64 add and one rounding emulate
    the FMA instructions torch's compiled bilinear kernel uses.
    """
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _linear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, ...]:
    """Source rows/columns and weights of float bilinear (``align_corners=False``).

    Returns:
        (``i0``, ``i1`` int64 ``[out]``, ``w0``, ``w1`` float32 ``[out]``).
    """
    out = np.arange(out_size)
    if in_size == out_size:
        return out, out, np.ones(out_size, np.float32), np.zeros(out_size, np.float32)
    scale = np.float32(in_size) / np.float32(out_size)
    centre = out.astype(np.float32) + np.float32(0.5)
    source = (np.float64(scale) * centre.astype(np.float64) - 0.5).astype(np.float32)
    source = np.maximum(source, np.float32(0.0))
    i0 = np.minimum(np.floor(source).astype(np.int64), in_size - 1)
    w1 = np.clip(source - i0.astype(np.float32), np.float32(0.0), np.float32(1.0))
    i1 = i0 + (i0 < in_size - 1)
    return i0, i1, (np.float32(1.0) - w1).astype(np.float32), w1.astype(np.float32)


def resize_bilinear(probs: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``[h, w]`` float32 -> ``size`` (h, w) float32, torch's bilinear ``align_corners=False``."""
    y0, y1, wy0, wy1 = _linear_taps(probs.shape[0], size[0])
    x0, x1, wx0, wx1 = _linear_taps(probs.shape[1], size[1])
    top = _fma(probs[y0][:, x0], wx0[None], probs[y0][:, x1] * wx1[None])
    bottom = _fma(probs[y1][:, x0], wx0[None], probs[y1][:, x1] * wx1[None])
    return _fma(top, wy0[:, None], bottom * wy1[:, None])


def expand_boxes(boxes: np.ndarray, scale: float) -> np.ndarray:
    """Scale ``[N, 4]`` float32 xyxy boxes about their centres (torchvision's float32 ops)."""
    factor = np.float32(scale)
    w_half = (boxes[:, 2] - boxes[:, 0]) * np.float32(0.5) * factor
    h_half = (boxes[:, 3] - boxes[:, 1]) * np.float32(0.5) * factor
    x_c = (boxes[:, 2] + boxes[:, 0]) * np.float32(0.5)
    y_c = (boxes[:, 3] + boxes[:, 1]) * np.float32(0.5)
    return np.stack([x_c - w_half, y_c - h_half, x_c + w_half, y_c + h_half], axis=1)


def runs_to_counts(transitions: np.ndarray, num_pixels: int) -> np.ndarray:
    """COCO's uncompressed counts from sorted run boundaries (column-major flat indices).

    The first count is background (possibly 0); a final background run of 0 is not
    written, as ``pycocotools.mask.encode`` does.
    """
    if transitions.size == 0:
        return np.array([num_pixels], dtype=np.uint32)
    counts = np.diff(transitions, prepend=0, append=num_pixels)
    if counts[-1] == 0:
        counts = counts[:-1]
    return counts.astype(np.uint32)


def crop_to_counts(crop: np.ndarray, top: int, left: int, image_hw: tuple[int, int]) -> np.ndarray:
    """Uncompressed COCO counts of an image that is background except for ``crop``.

    Args:
        crop: ``[ch, cw]`` bool foreground; ``top``, ``left``: its position in the image.
        image_hw: the full image's (h, w); the crop lies inside it.
    """
    height, width = image_hw
    # Each column of the crop is a run-boundary problem of its own (column-major order).
    padded = np.zeros((crop.shape[0] + 2, crop.shape[1]), dtype=bool)
    padded[1:-1] = crop
    col, row = np.nonzero((padded[1:] != padded[:-1]).T)
    transitions = (col.astype(np.int64) + left) * height + (row + top)
    # A run ending at the bottom of one column and one starting at the top of the next
    # are a single run in flat order (only when the crop spans the full height).
    touching = transitions[1:] == transitions[:-1]
    if touching.any():
        drop = np.zeros(transitions.shape, dtype=bool)
        drop[:-1] |= touching
        drop[1:] |= touching
        transitions = transitions[~drop]
    return runs_to_counts(transitions, height * width)


def paste_masks_rle(
    boxes: np.ndarray, probs: np.ndarray, image_hw: tuple[int, int], *, threshold: float = 0.5
) -> list[RLE]:
    """Paste ``[N, M, M]`` mask probabilities into their ``[N, 4]`` xyxy boxes; COCO RLEs.

    torchvision's ``paste_masks_in_image`` (map padded by one pixel, box expanded by
    ``(M + 2) / M`` and truncated to ints, bilinear resize to the box, ``> threshold``),
    computed over each box only and encoded as ``pycocotools.mask.encode`` would.
    """
    height, width = int(image_hw[0]), int(image_hw[1])
    if boxes.shape[0] == 0:
        return []
    size = probs.shape[-1]
    padded = np.pad(probs.astype(np.float32), ((0, 0), (_MASK_PADDING,) * 2, (_MASK_PADDING,) * 2))
    expanded = expand_boxes(boxes.astype(np.float32), (size + 2 * _MASK_PADDING) / size)
    counts: list[np.ndarray] = []
    for index, (bx0, by0, bx1, by1) in enumerate(np.trunc(expanded).astype(np.int64).tolist()):
        x0, x1 = max(bx0, 0), min(bx1 + 1, width)
        y0, y1 = max(by0, 0), min(by1 + 1, height)
        if x1 <= x0 or y1 <= y0:
            counts.append(runs_to_counts(np.zeros(0, np.int64), height * width))
            continue
        box_hw = (max(by1 - by0 + 1, 1), max(bx1 - bx0 + 1, 1))
        resized = resize_bilinear(padded[index], box_hw)
        crop = resized[y0 - by0 : y1 - by0, x0 - bx0 : x1 - bx0] > np.float32(threshold)
        counts.append(crop_to_counts(crop, y0, x0, (height, width)))
    return compress_counts(counts, (height, width))


def compress_counts(counts: Sequence[np.ndarray], image_hw: tuple[int, int]) -> list[RLE]:
    """Compress uncompressed COCO counts into COCO's string RLEs (``counts`` as ``str``)."""
    if not counts:
        return []
    height, width = image_hw
    uncompressed = [{"size": [height, width], "counts": c} for c in counts]
    encoded = mask_util.frPyObjects(uncompressed, height, width)
    return [{"size": [height, width], "counts": r["counts"].decode("utf-8")} for r in encoded]


# --------------------------------------------------------------------------- network


def run_batched(
    run: Callable[[np.ndarray], list[np.ndarray]],
    images: np.ndarray,
    static_batch: int | None,
) -> list[np.ndarray]:
    """The graph's outputs for ``images`` ``[n, 3, H, W]``, row ``i`` for image ``i``.

    ``run`` runs the graph on one batch. A dynamic graph (``static_batch`` None) gets all
    ``n`` images at once (the caller keeps ``n`` within the export's max_batch_size); a
    graph of static batch ``S`` gets ``S`` at a time, the last run filled with zero images
    whose rows are dropped (each image's outputs do not depend on the rest of its batch).
    """
    if static_batch is None:
        return run(np.ascontiguousarray(images))
    runs: list[list[np.ndarray]] = []
    for start in range(0, len(images), static_batch):
        chunk = images[start : start + static_batch]
        fill = np.zeros((static_batch - len(chunk), *chunk.shape[1:]), dtype=chunk.dtype)
        outputs = run(np.ascontiguousarray(np.concatenate([chunk, fill])))
        runs.append([out[: len(chunk)] for out in outputs])
    return [np.concatenate(parts) for parts in zip(*runs, strict=True)]


# --------------------------------------------------------------------------- results


def unpad(
    boxes: np.ndarray,
    scores: np.ndarray,
    labels: np.ndarray,
    masks: np.ndarray,
    num_detections: np.ndarray | int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One image's valid rows of the graph's padded outputs (no batch dimension).

    Args:
        boxes ``[D, 4]``, scores ``[D]``, labels ``[D]``, masks ``[D, M, M]`` and the
        count of valid rows.

    Returns:
        (boxes float32 ``[N, 4]``, scores float32 ``[N]``, labels int64 ``[N]``, masks
        float32 ``[N, M, M]``).
    """
    n = int(np.asarray(num_detections).reshape(-1)[0])
    return (
        np.asarray(boxes[:n], dtype=np.float32),
        np.asarray(scores[:n], dtype=np.float32),
        np.asarray(labels[:n], dtype=np.int64),
        np.asarray(masks[:n], dtype=np.float32),
    )


def categories_from_label_map(entries: Sequence[dict[str, Any]]) -> list[tuple[int, str]]:
    """``label_map.json`` entries (``id``, ``name``, ``label``) -> (id, name) per label 1..K."""
    ordered = sorted(entries, key=lambda e: int(e["label"]))
    if [int(e["label"]) for e in ordered] != list(range(1, len(ordered) + 1)):
        raise ValueError("label_map.json: labels must be 1..K")
    return [(int(e["id"]), str(e["name"])) for e in ordered]


def detections_to_coco(
    boxes: np.ndarray,
    scores: np.ndarray,
    labels: np.ndarray,
    masks: np.ndarray,
    *,
    scale: float,
    orig_hw: tuple[int, int],
    categories: Sequence[tuple[int, str]],
    score_threshold: float,
    mask_threshold: float = 0.5,
) -> list[dict[str, Any]]:
    """COCO results of one image's unpadded detections (see :func:`unpad`).

    Boxes go from the network's frame to original pixels (divided by ``scale``, clipped
    to ``orig_hw``) in float32 as the engine does; masks are pasted at those boxes.

    Returns:
        Per kept detection (``score >= score_threshold``): ``image_id`` 0,
        ``category_id``, ``category_name``, ``bbox`` ``[x, y, w, h]``, ``score``,
        ``segmentation`` (compressed RLE of the original image size).
    """
    keep = scores >= np.float32(score_threshold)
    kept_labels = labels[keep]
    if kept_labels.size and (kept_labels.min() < 1 or kept_labels.max() > len(categories)):
        raise ValueError(f"labels outside 1..{len(categories)} in the network output")
    original = boxes[keep] / np.float32(scale)
    original[:, 0::2] = np.clip(original[:, 0::2], 0, np.float32(orig_hw[1]))
    original[:, 1::2] = np.clip(original[:, 1::2], 0, np.float32(orig_hw[0]))
    rles = paste_masks_rle(original, masks[keep], orig_hw, threshold=mask_threshold)
    xywh = original.copy()
    xywh[:, 2:] -= xywh[:, :2]
    results: list[dict[str, Any]] = []
    for label, box, score, rle in zip(
        kept_labels.tolist(), xywh.tolist(), scores[keep].tolist(), rles, strict=True
    ):
        category_id, category_name = categories[label - 1]
        results.append(
            {
                "image_id": 0,
                "category_id": category_id,
                "bbox": box,
                "score": score,
                "segmentation": rle,
                "category_name": category_name,
            }
        )
    return results


def encode_detections(results: Sequence[dict[str, Any]]) -> bytes:
    """The ``detections_json`` bytes of one image (compact JSON list)."""
    return json.dumps(list(results), separators=(",", ":")).encode()


# --------------------------------------------------------------------------- Triton tensors
# The python backend's stub (PyPI and 24.12 Triton builds) is built with a pybind11 older
# than numpy 2 support, which reads a dtype's item size where numpy 1 kept it. Under
# numpy 2 it reads 0: the stub copies every input element from the first one (inputs arrive
# as one repeated value, zeros where the first is zero), sizes outputs at 0 bytes and loses
# BYTES tensors. DLPack does not go through that code: inputs are read and outputs handed
# over by DLPack, and the ensemble's encoded image and answer travel as UINT8
# (docs/architecture.md, "numpy 2 in the python backend").


def input_array(pb_utils: Any, request: Any, name: str) -> np.ndarray:
    """Input ``name`` of ``request`` as a read-only numpy view of the stub's buffer (valid
    during ``execute``; copy what must outlive it)."""
    return np.from_dlpack(pb_utils.get_input_tensor_by_name(request, name))


def output_tensor(pb_utils: Any, name: str, array: np.ndarray) -> Any:
    """A ``pb_utils.Tensor`` holding ``array``, handed over by DLPack.

    A C-contiguous, writable copy is made where ``array`` is not one: the stub asks for
    DLPack without a read-only flag, so numpy refuses to export a read-only array (a view
    of an input, say).
    """
    return pb_utils.Tensor.from_dlpack(name, np.require(array, requirements=("C", "W")))


def padded_rows(items: Sequence[bytes], fill: bytes) -> np.ndarray:
    """``items`` as a uint8 ``[n, L]`` array, each row padded with ``fill`` to the longest.

    ``detections_json`` rows are padded with spaces (JSON ignores trailing whitespace),
    ``image_bytes`` rows with zero bytes (JPEG and PNG decoders stop at their end marker).
    """
    longest = max((len(item) for item in items), default=0)
    rows = np.full((len(items), longest), fill[0], dtype=np.uint8)
    for row, item in zip(rows, items, strict=True):
        row[: len(item)] = np.frombuffer(item, dtype=np.uint8)
    return rows
