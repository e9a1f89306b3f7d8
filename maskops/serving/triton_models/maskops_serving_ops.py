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
  algorithm with int16 fixed-point weights) re-done in numpy, so it is bit-exact, where
  ``PIL.Image.resize`` (22-bit weights) differs by one grey level on ~3% of pixels: its
  integer sums as small float matrix products, exact (:func:`_resize_plan`), which BLAS
  computes many times faster than numpy's integer loops.
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
  is within 1e-7 of the 0.5 threshold. It is computed for all of an image's detections
  in a few numpy calls where it can be (:func:`paste_masks_rle`).

Tensor names are those of :mod:`maskops.serving.protocol` (a test checks they agree).

It is also the one home of the numpy helpers the engine shares with it (the engine imports
them from here, never the other way): :func:`to_rgb` and :data:`IMAGE_FORMATS`
(``maskops.evaluation.images``), :func:`fit_scale` and :func:`resized_hw`
(``maskops.data.transforms``), and the RLE counting :func:`runs_to_counts`,
:func:`crop_to_counts` and :func:`compress_counts` (``maskops.evaluation.postprocess``).
"""

from __future__ import annotations

import functools
import io
import json
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

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


@functools.lru_cache(maxsize=64)
def _aa_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Antialiased bilinear taps of one axis as torch's uint8 kernel computes them.

    Float weights in double (Pillow's ``precompute_coeffs``: a triangle filter widened by
    the downscale factor, normalised per output pixel), then rounded to int16 with the
    most fractional bits that keep the largest weight below 2**15. Every output pixel at
    once, with the kernel's double operations in its order (the per-pixel sum runs tap by
    tap), so the weights are equal; cached, as a server sees the same sizes again and
    again (read-only arrays).

    Returns:
        (``[out, K]`` int64 source indices, ``[out, K]`` int32 weights (0 past each
        pixel's taps), the number of fractional bits).
    """
    scale = in_size / out_size
    support = scale if scale >= 1.0 else 1.0  # interp_size 2 * 0.5, widened when shrinking
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    taps = int(np.ceil(support)) * 2 + 1
    center = scale * (np.arange(out_size) + 0.5)
    xmin = np.maximum(np.trunc(center - support + 0.5), 0.0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size)
    xsize = np.clip(xmax - xmin, 0, taps)
    index = xmin[:, None] + np.arange(taps)
    live = np.arange(taps) < xsize[:, None]
    weights = np.maximum(0.0, 1.0 - np.abs((index - center[:, None] + 0.5) * invscale))
    weights[~live] = 0.0
    total = np.zeros(out_size)
    for k in range(taps):  # sequential, as the kernel sums (adding a dead tap's 0 is exact)
        total += weights[:, k]
    nonzero = total != 0.0
    weights[nonzero] /= total[nonzero, None]
    index[~live] = 0
    peak = float(weights.max()) if weights.size else 0.0
    precision = 0
    while precision < 22 and int(0.5 + peak * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    fixed = np.trunc(0.5 + weights * (1 << precision)).astype(np.int32)
    index.flags.writeable = False
    fixed.flags.writeable = False
    return index, fixed, precision


class _Pass(NamedTuple):
    """One axis of the resize as small dense matrix products (:func:`_resize_pass`)."""

    blocks: tuple[tuple[int, int, int, int, np.ndarray], ...]
    """(first output, end output, first input, end input, weights ``[out, in]``)."""
    dtype: type[np.floating[Any]]
    largest_block: int
    """Weights in the largest block (the multiply-adds of a product, per row or column)."""
    clamp: bool
    """Whether a sum can pass 255 (the rounded weights of a pixel can add up to more than
    one): the clamp to 255 is then needed."""


_BLOCK_INPUTS = 16
"""About how many input pixels each block of outputs reads besides its taps: small dense
products, whose zeros (weights outside each output's few taps) cost less than numpy calls
per tap. Measured on 2 EPYC cores: 256 -> 832 px both ways in 1.7 ms (28 ms tap by tap
in int32); 8 and 32 were slower on larger images."""

_SUMS = 1 << 20
"""Sums a horizontal pass holds as floats at a time (4 or 8 MB)."""

_PRODUCT_SIZE = 1 << 18
"""Most multiply-adds in one matrix product: OpenBLAS (numpy's) runs a product of up to
65536 x ``GEMM_MULTITHREAD_THRESHOLD`` (4) on the calling thread (interface/gemm.c);
threads woken for each of these sub-millisecond products would cost more than they save
on a host busy with other models."""


@functools.lru_cache(maxsize=64)
def _resize_plan(in_size: int, out_size: int) -> _Pass:
    """:func:`_aa_weights` as blocks of dense weights for matrix products, scaled by
    ``2**-p``, in the narrowest float type that keeps every sum exact.

    Each product of an 8-bit pixel and an integer weight, and every partial sum, is an
    integer; the largest sum is ``255 * (a pixel's weights added up)``. Below 2**24,
    float32 holds all of them exactly, whatever order the BLAS adds them in (shrinking by
    more than about 2x, with more fractional bits, needs float64, exact to 2**53), and
    scaling by a power of two is exact: the products are the kernel's int32 sums, over
    ``2**p``.
    """
    index, fixed, precision = _aa_weights(in_size, out_size)
    row_sums = fixed.sum(axis=1, dtype=np.int64)
    largest = 255 * int(row_sums.max()) + (1 << (precision - 1))
    dtype: type[np.floating[Any]] = np.float32 if largest < (1 << 24) else np.float64
    per_block = max(1, round(_BLOCK_INPUTS * out_size / in_size))
    unit = dtype(1.0 / (1 << precision))
    blocks = []
    for start in range(0, out_size, per_block):
        end = min(start + per_block, out_size)
        rows, taps = np.nonzero(fixed[start:end])
        sources = index[start:end][rows, taps]
        low = int(sources.min()) if sources.size else 0
        high = int(sources.max()) + 1 if sources.size else 1
        dense = np.zeros((end - start, high - low), dtype=dtype)
        dense[rows, sources - low] = fixed[start:end][rows, taps].astype(dtype) * unit
        dense.flags.writeable = False
        blocks.append((start, end, low, high, dense))
    return _Pass(
        tuple(blocks),
        dtype,
        largest_block=max(block[4].size for block in blocks),
        clamp=largest >= (256 << precision),
    )


def _resize_pass(
    planes: np.ndarray, out_size: int, axis: int, out: np.ndarray | None = None
) -> np.ndarray:
    """One separable pass of the uint8 antialiased bilinear resize, along ``axis`` (1:
    rows, 2: columns) of ``[C, H, W]`` uint8 planes.

    Torch's kernel: int32 sums of uint8 x int16 products, rounding offset ``2**(p-1)``,
    arithmetic shift by ``p``, clamped to 0..255. Here: the same sums over ``2**p`` as
    exact float products (:func:`_resize_plan`), then ``floor(sum + 1/2)``, also exact.
    The pixels are converted to floats a block at a time: a large input never exists as
    floats (a 6000 x 4000 PNG would take 0.6 GB).

    Returns:
        A horizontal pass: uint8 planes, as torch's. A vertical pass: the plan's float
        type, whole values 0..255, in ``out`` where given and of that type.
    """
    plan = _resize_plan(planes.shape[axis], out_size)
    channels, height, width = planes.shape
    if axis == 2:
        rows = np.ascontiguousarray(planes).reshape(channels * height, width)
        resized = np.empty((channels * height, out_size), dtype=np.uint8)
        step = max(1, min(_PRODUCT_SIZE // plan.largest_block, _SUMS // out_size))
        sums = np.empty((min(step, rows.shape[0]), out_size), dtype=plan.dtype)
        for first in range(0, rows.shape[0], step):
            part = slice(first, first + step)
            chunk = sums[: rows[part].shape[0]]
            for start, end, low, high, dense in plan.blocks:
                np.matmul(rows[part, low:high], dense.T, out=chunk[:, start:end])
            resized[part] = _rounded(chunk, plan)
        return resized.reshape(channels, height, out_size)
    if out is None or out.dtype != plan.dtype:
        out = np.empty((channels, out_size, width), dtype=plan.dtype)
    step = max(1, _PRODUCT_SIZE // (channels * plan.largest_block))
    for start, end, low, high, dense in plan.blocks:
        for first in range(0, width, step):
            part = slice(first, first + step)
            np.matmul(dense, planes[:, low:high, part], out=out[:, start:end, part])
    return _rounded(out, plan)


def _rounded(sums: np.ndarray, plan: _Pass) -> np.ndarray:
    """``sums`` (over ``2**p``) rounded and clamped as the kernel's shift, in place."""
    sums += plan.dtype(0.5)
    np.floor(sums, out=sums)
    if plan.clamp:  # weights are >= 0: never below 0
        np.minimum(sums, plan.dtype(255.0), out=sums)
    return sums


def _resize_planes(
    image: np.ndarray, size: tuple[int, int], out: np.ndarray | None = None
) -> np.ndarray:
    """``[H, W, C]`` uint8 -> ``[C, h, w]`` planes of torch's uint8 antialiased bilinear
    resize (whole values 0..255, uint8 or float; in ``out`` where a float32 vertical pass
    can write them there).

    Horizontal pass first, then vertical, each skipped when that side keeps its length
    (whole values in between, as torch's uint8).
    """
    planes: np.ndarray = image.transpose(2, 0, 1)
    if size[1] != image.shape[1]:
        planes = _resize_pass(planes, size[1], axis=2)
    if size[0] != image.shape[0]:
        planes = _resize_pass(planes, size[0], axis=1, out=out)
    return planes


def resize_uint8(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize ``[H, W, C]`` uint8 to ``size`` (h, w): torch's uint8 antialiased bilinear."""
    return np.ascontiguousarray(_resize_planes(image, size).astype(np.uint8).transpose(1, 2, 0))


def resize_and_pad(
    image: np.ndarray,
    image_size: tuple[int, int],
    full_hw: tuple[int, int] | None = None,
    *,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """Resize ``[H, W, 3]`` uint8 keeping the aspect ratio to fit ``image_size``, then pad.

    ``full_hw``: the original size when ``image`` was decoded reduced (see
    :func:`load_rgb`); the output size and the scale are those of the original.
    ``out``: a ``[3, *image_size]`` array to write into (a batch's row, say), float32 for
    values in 0..1 or uint8 for 0..255 (a quarter of the bytes; the torch network divides
    by 255 on its device, bit for bit as here); all of it is written. By default a new
    float32 one.

    Returns:
        (``[3, image_size[0], image_size[1]]`` float32 in 0..1 or uint8, zero-padded
        bottom/right; ``scale``, which maps original pixel coordinates to the returned
        frame).
    """
    height, width = full_hw or (int(image.shape[0]), int(image.shape[1]))
    scale = fit_scale(height, width, image_size)
    new_h, new_w = resized_hw(height, width, image_size)
    if out is None:
        out = np.zeros((3, *image_size), dtype=np.float32)
    else:
        if out.shape != (3, *image_size) or out.dtype not in (np.float32, np.uint8):
            raise ValueError(
                f"out: float32 or uint8 [3, {image_size[0]}, {image_size[1]}] expected"
            )
        out[:, new_h:] = 0
        out[:, :new_h, new_w:] = 0
    region = out[:, :new_h, :new_w]
    planes = image.transpose(2, 0, 1)
    if (new_h, new_w) != image.shape[:2]:
        planes = _resize_planes(image, (new_h, new_w), out=region)
    if out.dtype == np.uint8:
        np.copyto(region, planes, casting="unsafe")  # whole values 0..255: exact
    else:
        # float32(v) / 255, as torch's uint8 -> float32 copy then division (in place where
        # the resize wrote into ``region``).
        np.divide(planes, np.float32(255.0), out=region, dtype=np.float32)
    return out, scale


def preprocess(
    data: bytes,
    image_size: tuple[int, int],
    *,
    name: str = "image",
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Encoded image -> (``[3, H, W]`` network input, scale, original (h, w)).

    ``out``: where to write the network input, float32 or uint8 (see
    :func:`resize_and_pad`).

    Raises:
        ImageDecodeError: not a decodable JPEG/PNG (message names ``name``).
    """
    image, orig_hw = load_rgb(data, name=name, fit=image_size)
    tensor, scale = resize_and_pad(image, image_size, orig_hw, out=out)
    return tensor, float(scale), orig_hw


# --------------------------------------------------------------------------- mask pasting


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a * b + c`` rounded once, as a fused multiply-add.

    float32 products are exact in float64, so one float64 add and one rounding emulate
    the FMA instructions torch's compiled bilinear kernel uses.
    """
    # Not ``a.astype(np.float64) * b...``: numpy then multiplies into that temporary in
    # place, which with a broadcast ``b`` ran 20x slower (numpy 2.4: 1.2 ms for a
    # [30, 6548] by [6548], paste_masks_rle's horizontal pass of 100 masks).
    wide = np.multiply(a, b, dtype=np.float64)
    wide += c
    return wide.astype(np.float32)


def _taps_at(
    in_size: int, out_sizes: np.ndarray, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Source rows/columns and weights of float bilinear (``align_corners=False``) for
    output pixel ``positions[i]`` of a resize from ``in_size`` to ``out_sizes[i]``: many
    resizes' taps in one go, each as :func:`_linear_taps` computes it.

    Returns:
        (``i0``, ``i1`` int64, ``w0``, ``w1`` float32), each shaped as ``positions``.
    """
    scale = np.float32(in_size) / out_sizes.astype(np.float32)
    centre = positions.astype(np.float32) + np.float32(0.5)
    source = (scale.astype(np.float64) * centre.astype(np.float64) - 0.5).astype(np.float32)
    source = np.maximum(source, np.float32(0.0))
    i0 = np.minimum(np.floor(source).astype(np.int64), in_size - 1)
    w1 = np.clip(source - i0.astype(np.float32), np.float32(0.0), np.float32(1.0))
    i1 = i0 + (i0 < in_size - 1)
    # A side that keeps its length is copied, as torch does (taps i, i; weights 1, 0).
    same = out_sizes == in_size
    i0 = np.where(same, positions, i0)
    i1 = np.where(same, positions, i1)
    w1 = np.where(same, np.float32(0.0), w1).astype(np.float32)
    return i0, i1, (np.float32(1.0) - w1).astype(np.float32), w1


def _linear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, ...]:
    """Source rows/columns and weights of float bilinear (``align_corners=False``).

    Returns:
        (``i0``, ``i1`` int64 ``[out]``, ``w0``, ``w1`` float32 ``[out]``).
    """
    return _taps_at(in_size, np.full(out_size, out_size), np.arange(out_size))


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
    # np.diff(transitions, prepend=0, append=num_pixels) without its copies (one call a
    # detection: its overhead was a third of crop_to_counts).
    last = int(transitions[-1])
    counts = np.empty(transitions.size + (last != num_pixels), dtype=np.uint32)
    counts[0] = transitions[0]
    np.subtract(
        transitions[1:], transitions[:-1], out=counts[1 : transitions.size], casting="unsafe"
    )
    if last != num_pixels:
        counts[-1] = num_pixels - last
    return counts


def crop_to_counts(crop: np.ndarray, top: int, left: int, image_hw: tuple[int, int]) -> np.ndarray:
    """Uncompressed COCO counts of an image that is background except for ``crop``.

    Args:
        crop: ``[ch, cw]`` bool foreground; ``top``, ``left``: its position in the image.
        image_hw: the full image's (h, w); the crop lies inside it.
    """
    crop_h, crop_w = crop.shape
    columns = np.zeros((crop_w, crop_h + 2), dtype=bool)
    columns[:, 1:-1] = crop.T
    return _columns_to_counts(columns, top, left, image_hw)


def _columns_to_counts(
    columns: np.ndarray, top: int, left: int, image_hw: tuple[int, int]
) -> np.ndarray:
    """:func:`crop_to_counts` of a crop held column-major (COCO's order), with background
    above and below every column: ``[cw, ch + 2]``, C-contiguous, first and last rows
    False. Each column's run boundaries are then where the flat array changes."""
    height, width = image_hw
    stride = columns.shape[1]
    flat = columns.reshape(-1)
    changes = np.flatnonzero(flat[1:] != flat[:-1])
    # Change ``p`` is at row ``p % stride`` of column ``p // stride``; in the image, column
    # ``left + p // stride`` and row ``top + p % stride``.
    transitions = changes + (changes // stride) * (height - stride) + (left * height + top)
    if stride == height + 2:  # the full height: see _touching
        keep = _touching(transitions)
        if keep is not None:
            transitions = transitions[keep]
    return runs_to_counts(transitions, height * width)


def _touching(transitions: np.ndarray) -> np.ndarray | None:
    """Which boundaries to keep (None: all): in a crop spanning the image's height, a run
    ending at the bottom of one column and one starting at the top of the next are one
    run in flat order, and their two equal boundaries none."""
    touching = transitions[1:] == transitions[:-1]
    if not touching.any():
        return None
    drop = np.zeros(transitions.shape, dtype=bool)
    drop[:-1] |= touching
    drop[1:] |= touching
    return ~drop


def paste_masks_rle(
    boxes: np.ndarray, probs: np.ndarray, image_hw: tuple[int, int], *, threshold: float = 0.5
) -> list[RLE]:
    """Paste ``[N, M, M]`` mask probabilities into their ``[N, 4]`` xyxy boxes; COCO RLEs.

    torchvision's ``paste_masks_in_image`` (map padded by one pixel, box expanded by
    ``(M + 2) / M`` and truncated to ints, bilinear resize to the box, ``> threshold``),
    computed over the part of each box inside the image only and encoded as
    ``pycocotools.mask.encode`` would.

    The same float32 operations as :func:`resize_bilinear` on each whole box, so the
    same pixels; arranged so that little of it runs once per detection (100 a image,
    each a few numpy calls): the taps of every detection's crop columns and rows, and
    the horizontal pass of every crop column over the map's rows (which the vertical
    pass reads for each output row, rather than redoing it for each), are computed for
    all detections at once; then each detection's vertical pass is thresholded straight
    into COCO's column-major order.
    """
    height, width = int(image_hw[0]), int(image_hw[1])
    count = boxes.shape[0]
    if count == 0:
        return []
    size = probs.shape[-1]
    source = size + 2 * _MASK_PADDING
    padded = np.pad(probs.astype(np.float32), ((0, 0), (_MASK_PADDING,) * 2, (_MASK_PADDING,) * 2))
    expanded = expand_boxes(boxes.astype(np.float32), source / size)
    bx0, by0, bx1, by1 = np.trunc(expanded).astype(np.int64).T
    x0, x1 = np.maximum(bx0, 0), np.minimum(bx1 + 1, width)
    y0, y1 = np.maximum(by0, 0), np.minimum(by1 + 1, height)
    live = (x1 > x0) & (y1 > y0)
    crop_w = np.where(live, x1 - x0, 0)
    crop_h = np.where(live, y1 - y0, 0)
    col_first = np.cumsum(crop_w) - crop_w
    row_first = np.cumsum(crop_h) - crop_h

    # Every detection's crop columns: their taps, and the horizontal pass at every row of
    # the padded map, ``[source rows, columns]`` (columns last: numpy's inner loops then
    # run along them, not along 30 rows).
    col_of = np.repeat(np.arange(count), crop_w)
    at_x = np.arange(col_of.size) - col_first[col_of] + (x0 - bx0)[col_of]
    xi0, xi1, wx0, wx1 = _taps_at(source, np.maximum(bx1 - bx0 + 1, 1)[col_of], at_x)
    by_row = padded.transpose(1, 0, 2).reshape(source, count * source)
    left = np.take(by_row, col_of * source + xi0, axis=1)
    right = np.take(by_row, col_of * source + xi1, axis=1)
    columns = _fma(left, wx0, right * wx1)
    # Every detection's crop rows: their taps.
    row_of = np.repeat(np.arange(count), crop_h)
    at_y = np.arange(row_of.size) - row_first[row_of] + (y0 - by0)[row_of]
    yi0, yi1, wy0, wy1 = _taps_at(source, np.maximum(by1 - by0 + 1, 1)[row_of], at_y)
    wy0, wy1 = wy0[:, None], wy1[:, None]

    cut = np.float32(threshold)
    counts = [runs_to_counts(np.zeros(0, np.int64), height * width)] * count
    spans = (a[live].tolist() for a in (np.arange(count), col_first, crop_w, row_first, crop_h))
    lefts, tops = x0[live].tolist(), y0[live].tolist()
    for index, c0, cw, r0, ch, left, top in zip(*spans, lefts, tops, strict=True):
        band, rows = columns[:, c0 : c0 + cw], slice(r0, r0 + ch)
        # resize_bilinear's vertical pass over the crop: [rows, cols].
        crop = _fma(
            np.take(band, yi0[rows], axis=0),
            wy0[rows],
            np.take(band, yi1[rows], axis=0) * wy1[rows],
        )
        # Thresholded straight into COCO's column-major order, background above and below.
        mask = np.zeros((cw, ch + 2), dtype=bool)
        np.greater(crop, cut, out=mask[:, 1:-1].T)
        counts[index] = _columns_to_counts(mask, top, left, (height, width))
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


def boxes_to_original(boxes: np.ndarray, *, scale: float, orig_hw: tuple[int, int]) -> np.ndarray:
    """``[N, 4]`` xyxy boxes of the network's frame in original pixels: divided by
    ``scale`` and clipped to ``orig_hw``, in float32 as the engine's
    ``maskops.evaluation.postprocess.boxes_to_original``."""
    original = boxes / np.float32(scale)
    original[:, 0::2] = np.clip(original[:, 0::2], 0, np.float32(orig_hw[1]))
    original[:, 1::2] = np.clip(original[:, 1::2], 0, np.float32(orig_hw[0]))
    return original


def has_area(boxes: np.ndarray) -> np.ndarray:
    """``[N]`` bool: which ``[N, 4]`` xyxy boxes, clipped to the image, keep some area. A
    detection wholly in the input's padding is clipped to the image's edge and keeps
    none: nothing of it is in the image, so it is not reported (as detectron2's
    ``detector_postprocess`` drops empty boxes)."""
    return (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])


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
        Per kept detection (``score >= score_threshold``, and a box with some area once
        clipped: :func:`has_area`): ``image_id`` 0,
        ``category_id``, ``category_name``, ``bbox`` ``[x, y, w, h]``, ``score``,
        ``segmentation`` (compressed RLE of the original image size).
    """
    original = boxes_to_original(boxes, scale=scale, orig_hw=orig_hw)
    keep = (scores >= np.float32(score_threshold)) & has_area(original)
    kept_labels = labels[keep]
    if kept_labels.size and (kept_labels.min() < 1 or kept_labels.max() > len(categories)):
        raise ValueError(f"labels outside 1..{len(categories)} in the network output")
    original = original[keep]
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


def output_dtype(model_config: dict[str, Any], name: str) -> type[np.uint8 | np.float32]:
    """The numpy type of output ``name`` in a model's config (Triton's JSON of it, the
    ``model_config`` argument of ``initialize``): uint8 for TYPE_UINT8, float32 for
    TYPE_FP32.

    Raises:
        ValueError: no such output, or another type.
    """
    types: dict[str, type[np.uint8 | np.float32]] = {
        "TYPE_UINT8": np.uint8,
        "TYPE_FP32": np.float32,
    }
    for output in model_config.get("output", []):
        if output.get("name") == name and output.get("data_type") in types:
            return types[output["data_type"]]
    raise ValueError(f"the model's config has no UINT8 or FP32 output {name!r}")


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
