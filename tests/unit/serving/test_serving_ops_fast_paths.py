"""The served ensemble's numpy processing against plain per-pixel / per-detection twins.

``maskops_serving_ops`` computes the uint8 antialiased resize as small float matrix
products and pastes all of an image's masks in a few numpy calls; the straightforward
forms below (torch's int32 kernel tap by tap, one resize per box) are what they replace,
and the results must be equal, not close: these are the served answers, which
tests/unit/serving/test_serving_ops_parity.py holds to the engine's.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pycocotools.mask as mask_util
import pytest

# --------------------------------------------------------------------------- resizing


def _weights_per_pixel(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """torch's uint8 antialiased taps, one output pixel at a time in Python doubles."""
    scale = in_size / out_size
    support = scale if scale >= 1.0 else 1.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    taps = int(np.ceil(support)) * 2 + 1
    index = np.zeros((out_size, taps), dtype=np.int64)
    weights = np.zeros((out_size, taps), dtype=np.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        xmin = max(int(center - support + 0.5), 0)
        xsize = min(max(min(int(center + support + 0.5), in_size) - xmin, 0), taps)
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
    return index, np.trunc(0.5 + weights * (1 << precision)).astype(np.int32), precision


def _resize_int32(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """torch's uint8 kernel tap by tap in int32: horizontal pass, then vertical."""
    out = image
    for axis, length in ((1, size[1]), (0, size[0])):
        if length == out.shape[axis]:
            continue
        index, weights, precision = _weights_per_pixel(out.shape[axis], length)
        source = np.moveaxis(out, axis, 0)
        acc = np.full((length, *source.shape[1:]), 1 << (precision - 1), dtype=np.int32)
        for k in range(index.shape[1]):
            acc += source[index[:, k]].astype(np.int32) * weights[:, k].reshape(-1, 1, 1)
        out = np.moveaxis(np.clip(acc >> precision, 0, 255).astype(np.uint8), 0, axis)
    return out


def test_resize_weights_equal_the_per_pixel_doubles(ops) -> None:
    rng = np.random.default_rng(0)
    pairs = [(1, 1), (1, 7), (7, 1), (256, 832), (832, 256), (5000, 40), (2049, 512)]
    pairs += [(int(a), int(b)) for a, b in rng.integers(1, 500, (150, 2))]
    for in_size, out_size in pairs:
        index, weights, precision = ops._aa_weights(in_size, out_size)
        want_index, want_weights, want_precision = _weights_per_pixel(in_size, out_size)
        assert precision == want_precision, (in_size, out_size)
        np.testing.assert_array_equal(index, want_index)
        np.testing.assert_array_equal(weights, want_weights)


@pytest.mark.parametrize("content", ["noise", "white", "black and white"])
def test_resize_equals_the_int32_kernel(ops, content: str) -> None:
    """Up and down, by whole and odd factors; shrinking by more than ~2x takes the float64
    products, white images the clamp at 255."""
    rng = np.random.default_rng(["noise", "white", "black and white"].index(content))
    shapes = [((256, 256), (832, 832)), ((1000, 1000), (20, 20)), ((1, 5000), (1, 40))]
    shapes += [((3000, 2), (7, 1)), ((1, 1), (64, 64)), ((2, 2), (1, 1)), ((37, 301), (64, 96))]
    for _ in range(60):
        hw = (int(rng.integers(1, 300)), int(rng.integers(1, 300)))
        shapes.append((hw, (int(rng.integers(1, 700)), int(rng.integers(1, 700)))))
    for hw, size in shapes:
        if content == "noise":
            image = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
        elif content == "white":
            image = np.full((*hw, 3), 255, dtype=np.uint8)
        else:
            image = (rng.random((*hw, 3)) < 0.5).astype(np.uint8) * 255
        np.testing.assert_array_equal(
            ops.resize_uint8(image, size), _resize_int32(image, size), err_msg=f"{hw} {size}"
        )


def test_float32_sums_are_used_only_where_exact(ops) -> None:
    for in_size, out_size in ((256, 832), (480, 832), (1000, 480), (4000, 512), (1, 5000)):
        _, weights, precision = ops._aa_weights(in_size, out_size)
        largest = 255 * int(weights.sum(axis=1).max()) + (1 << (precision - 1))
        plan = ops._resize_plan(in_size, out_size)
        assert (plan.dtype is np.float32) == (largest < 2**24), (in_size, out_size)
        assert all(block[4].size <= plan.largest_block for block in plan.blocks)
    assert ops._resize_plan(256, 832).dtype is np.float32  # the served 256 px images
    assert ops._resize_plan(4000, 512).dtype is np.float64


def test_resize_and_pad_writes_all_of_a_given_output(ops) -> None:
    rng = np.random.default_rng(4)
    for hw in ((256, 256), (300, 40), (64, 96), (1, 1)):
        image = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
        want, want_scale = ops.resize_and_pad(image, (64, 96))
        row = np.full((3, 64, 96), np.nan, dtype=np.float32)  # a batch row, not zeroed
        got, scale = ops.resize_and_pad(image, (64, 96), out=row)
        assert got is row and scale == want_scale
        np.testing.assert_array_equal(row, want)
    with pytest.raises(ValueError, match="float32 or uint8"):
        ops.resize_and_pad(image, (64, 96), out=np.zeros((3, 64, 96), np.float64))


def test_a_uint8_output_holds_the_float_outputs_pixels_before_the_division(ops) -> None:
    """What the preprocess model hands the torch network: the same resized, padded pixels
    as whole values, which divided by 255 in float32 are the float output to the bit."""
    rng = np.random.default_rng(5)
    for hw in ((256, 256), (300, 40), (64, 96), (1, 1), (640, 960)):
        image = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
        want, want_scale = ops.resize_and_pad(image, (64, 96))
        row = np.full((3, 64, 96), 7, dtype=np.uint8)  # a batch row, not zeroed
        got, scale = ops.resize_and_pad(image, (64, 96), out=row)
        assert got is row and scale == want_scale
        np.testing.assert_array_equal(row.astype(np.float32) / np.float32(255.0), want)


# --------------------------------------------------------------------------- mask pasting


def _encoded(
    boxes: np.ndarray,
    probs: np.ndarray,
    image_hw: tuple[int, int],
    ops: ModuleType,
    threshold: float = 0.5,
) -> list[str]:
    """Each whole box resized on its own (resize_bilinear), cropped to the image, pasted
    into a full mask and encoded by pycocotools."""
    height, width = image_hw
    size = probs.shape[-1]
    padded = np.pad(probs.astype(np.float32), ((0, 0), (1, 1), (1, 1)))
    expanded = ops.expand_boxes(boxes.astype(np.float32), (size + 2) / size)
    strings = []
    for index, (bx0, by0, bx1, by1) in enumerate(np.trunc(expanded).astype(np.int64).tolist()):
        full = np.zeros((height, width), dtype=np.uint8, order="F")
        x0, x1 = max(bx0, 0), min(bx1 + 1, width)
        y0, y1 = max(by0, 0), min(by1 + 1, height)
        if x1 > x0 and y1 > y0:
            resized = ops.resize_bilinear(padded[index], (by1 - by0 + 1, bx1 - bx0 + 1))
            full[y0:y1, x0:x1] = resized[y0 - by0 : y1 - by0, x0 - bx0 : x1 - bx0] > np.float32(
                threshold
            )
        strings.append(mask_util.encode(full)["counts"].decode())
    return strings


def _boxes(rng: np.random.Generator, n: int, hw: tuple[int, int], clip: bool) -> np.ndarray:
    """Boxes anywhere around the image, some tiny, some larger than it."""
    h, w = hw
    x0, y0 = rng.uniform(-20, w + 5, n), rng.uniform(-20, h + 5, n)
    bw, bh = rng.uniform(0, w * 1.2, n) ** rng.choice([1.0, 0.5]), rng.uniform(0, h * 1.2, n)
    boxes = np.stack([x0, y0, x0 + bw, y0 + bh], axis=1).astype(np.float32)
    if clip:
        boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, w)
        boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, h)
    if n >= 3:  # the whole image (runs cross columns), and a box one pixel in from the sides
        boxes[:2] = [0, 0, w, h]
        boxes[2] = [1, 0, w - 1, h]
    return boxes


@pytest.mark.parametrize("seed", range(6))
def test_paste_equals_one_resize_per_box(ops, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for trial in range(40):
        hw = (int(rng.integers(1, 200)), int(rng.integers(1, 200)))
        if trial % 9 == 0:
            hw = (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
        n, m = int(rng.integers(0, 30)), int(rng.choice([5, 14, 28]))
        boxes = _boxes(rng, n, hw, clip=trial % 2 == 0)
        probs = rng.random((n, m, m), dtype=np.float32)
        kind = trial % 4
        if kind == 1:
            probs[:] = 1.0  # full boxes
        elif kind == 2:
            probs[:] = np.float32(0.5)  # at the threshold: background
        elif kind == 3:
            probs = np.round(probs * 4) / np.float32(4)  # plateaus at and around it
        threshold = float(rng.choice([0.5, 0.0, 0.3]))
        got = ops.paste_masks_rle(boxes, probs, hw, threshold=threshold)
        assert all(r["size"] == list(hw) for r in got)
        want = _encoded(boxes, probs, hw, ops, threshold)
        assert [r["counts"] for r in got] == want, (seed, trial, hw, n)


def test_paste_of_boxes_the_size_of_the_map(ops) -> None:
    """A box side as long as the padded map (30 px for 28x28 masks) copies it: the taps
    of that side are the identity."""
    rng = np.random.default_rng(7)
    for side in range(20, 40):
        boxes = np.array([[2, 3, 2 + side, 3 + side], [0, 0, side, side / 2]], np.float32)
        probs = rng.random((2, 28, 28), dtype=np.float32)
        got = [r["counts"] for r in ops.paste_masks_rle(boxes, probs, (100, 90))]
        assert got == _encoded(boxes, probs, (100, 90), ops)


def test_runs_to_counts_equals_the_diff_of_its_boundaries(ops) -> None:
    rng = np.random.default_rng(8)
    for _ in range(500):
        pixels = int(rng.integers(1, 60))
        picked = rng.choice(
            pixels + 1, size=int(rng.integers(0, min(8, pixels + 1))), replace=False
        )
        transitions = np.sort(picked).astype(np.int64)
        counts = ops.runs_to_counts(transitions, pixels)
        want = np.diff(transitions, prepend=0, append=pixels)
        want = want[:-1] if transitions.size and want[-1] == 0 else want
        assert counts.dtype == np.uint32
        np.testing.assert_array_equal(counts, want if transitions.size else [pixels])


def test_the_preprocess_model_takes_its_image_type_from_its_config(ops) -> None:
    config = {"output": [{"name": "scale", "data_type": "TYPE_FP32"}]}
    config["output"].append({"name": "images", "data_type": "TYPE_UINT8"})
    assert ops.output_dtype(config, "images") is np.uint8
    assert ops.output_dtype(config, "scale") is np.float32
    with pytest.raises(ValueError, match="no UINT8 or FP32 output 'orig_hw'"):
        ops.output_dtype(config, "orig_hw")
