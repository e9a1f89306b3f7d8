"""maskops' box coding is torchvision's to the bit, without tensors made from host data."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from torchvision.models.detection._utils import BoxCoder

from maskops.modeling import build_model
from maskops.modeling.box_coder import HostScalarBoxCoder, values_in
from maskops.spec.models import MaskRCNNConfig
from maskops.training.host_reads import HostReadCounter

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
WEIGHTS = [
    (1.0, 1.0, 1.0, 1.0),  # the RPN's
    (10.0, 10.0, 5.0, 5.0),  # the RoI heads' default
    (1 / 3, 0.1, 7.3, 2.2),  # none exact in float16 or bfloat16: their rounding matters
]


def _bits(t: Tensor) -> Tensor:
    """``t``'s bits as integers: equal only where every element is the same float."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same_bits(got: Tensor, expected: Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(_bits(got), _bits(expected))


def _boxes(count: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """``[count, 4]`` xyxy boxes with positive sizes, off the integer grid."""
    corner = torch.rand((count, 2), generator=generator) * 500
    size = torch.rand((count, 2), generator=generator) * 200 + 0.25
    return torch.cat([corner, corner + size], dim=1).to(dtype)


def _float32_bits(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def test_values_in_a_dtype_are_what_a_tensor_of_that_dtype_holds() -> None:
    """Random values, float32's and float16's extremes, and values at and next to the
    ties of each dtype's rounding (torch rounds a Python float to float32 first, so
    ``1 + 2**-11 + 2**-40`` is a tie that goes to 1.0 in float16, not up)."""
    rng = random.Random(0)
    values = [rng.uniform(-1e3, 1e3) for _ in range(2000)]
    values += [rng.uniform(-1e-5, 1e-5) for _ in range(500)]
    values += [1e-6, 1 / 3, 0.1, 65504.0, 65519.0, 65520.0, 3.4e38, 3.5e38, -1e39, 1e-45]
    values += [1e-40, 0.0, -0.0, math.inf, -math.inf, 1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-40]
    for _ in range(2000):
        bits = rng.getrandbits(32) & 0x7F7FFFFF
        values.append(_float32_bits(bits))
        values.append(_float32_bits((bits & 0xFFFF0000) | 0x8000))  # a bfloat16 tie
        values.append(_float32_bits((bits & 0xFFFFE000) | 0x1000))  # a float16 tie
    for dtype in [torch.float64, *FLOATS, torch.int64]:
        expected = torch.as_tensor(values[: 2500 if dtype == torch.int64 else None], dtype=dtype)
        got = torch.tensor(values_in(values[: len(expected)], dtype), dtype=torch.float64)
        assert_same_bits(got, expected.to(torch.float64))


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("reference_dtype", FLOATS)
@pytest.mark.parametrize("proposal_dtype", FLOATS)
def test_encoding_is_torchvisions_to_the_bit(
    weights: tuple[float, float, float, float],
    reference_dtype: torch.dtype,
    proposal_dtype: torch.dtype,
) -> None:
    generator = torch.Generator().manual_seed(0)
    reference = _boxes(4000, generator, reference_dtype)
    proposals = _boxes(4000, generator, proposal_dtype)
    got = HostScalarBoxCoder(weights).encode_single(reference, proposals)
    assert_same_bits(got, BoxCoder(weights).encode_single(reference, proposals))
    got_list = HostScalarBoxCoder(weights).encode(
        [reference[:10], reference[10:]], [proposals[:10], proposals[10:]]
    )
    expected_list = BoxCoder(weights).encode(
        [reference[:10], reference[10:]], [proposals[:10], proposals[10:]]
    )
    for part, reference_part in zip(got_list, expected_list, strict=True):
        assert_same_bits(part, reference_part)


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("code_dtype", FLOATS)
@pytest.mark.parametrize("box_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("clip", [math.log(1000.0 / 16), 1.5])
def test_decoding_is_torchvisions_to_the_bit_clamp_included(
    weights: tuple[float, float, float, float],
    code_dtype: torch.dtype,
    box_dtype: torch.dtype,
    clip: float,
) -> None:
    generator = torch.Generator().manual_seed(1)
    boxes = _boxes(3000, generator, box_dtype)
    codes = torch.randn((3000, 8), generator=generator) * 2  # two boxes per reference box
    codes[:, 2::4] *= 3 * weights[2]  # many size deltas past the clamp
    codes[:, 3::4] *= 3 * weights[3]
    codes = codes.to(code_dtype)
    assert bool((codes[:, 2::4].float() / weights[2] > clip).any())
    ours, theirs = HostScalarBoxCoder(weights, clip), BoxCoder(weights, clip)
    assert_same_bits(ours.decode_single(codes, boxes), theirs.decode_single(codes, boxes))
    per_image = [boxes[:1000], boxes[1000:]]
    assert_same_bits(ours.decode(codes, per_image), theirs.decode(codes, per_image))


def test_under_bf16_autocast_both_codings_are_torchvisions() -> None:
    generator = torch.Generator().manual_seed(2)
    reference, proposals = (
        _boxes(500, generator, torch.float32),
        _boxes(500, generator, torch.float32),
    )
    codes = torch.randn((500, 4), generator=generator).bfloat16()
    weights = WEIGHTS[2]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for ours, theirs in [
            (
                HostScalarBoxCoder(weights).encode_single(reference, proposals),
                BoxCoder(weights).encode_single(reference, proposals),
            ),
            (
                HostScalarBoxCoder(weights).encode_single(reference.bfloat16(), proposals),
                BoxCoder(weights).encode_single(reference.bfloat16(), proposals),
            ),
            (
                HostScalarBoxCoder(weights).decode_single(codes, proposals),
                BoxCoder(weights).decode_single(codes, proposals),
            ),
        ]:
            assert_same_bits(ours, theirs)


def test_unrounded_python_weights_would_not_be_torchvisions() -> None:
    """Why the weights are rounded to the boxes' dtype first: a Python float enters a
    bfloat16 product at float32 precision, torchvision's 0-dim tensor at bfloat16's."""
    x = _boxes(1000, torch.Generator().manual_seed(3), torch.bfloat16)[:, 0]
    weight = torch.as_tensor(0.1, dtype=torch.bfloat16)
    assert not torch.equal(0.1 * x, weight * x)
    (rounded,) = values_in((0.1,), torch.bfloat16)
    assert torch.equal(rounded * x, weight * x)


def test_coding_makes_no_tensor_from_host_data_where_torchvisions_made_three() -> None:
    generator = torch.Generator().manual_seed(4)
    reference, proposals = (
        _boxes(50, generator, torch.float32),
        _boxes(50, generator, torch.float32),
    )
    codes = torch.randn((50, 4), generator=generator)
    counts = {}
    for name, coder in [("ours", HostScalarBoxCoder(WEIGHTS[1])), ("theirs", BoxCoder(WEIGHTS[1]))]:
        with HostReadCounter() as reads:
            coder.encode_single(reference, proposals)
            coder.decode(codes, [proposals])
        assert reads.total == 0, reads.by_call
        counts[name] = reads.from_host
    assert counts == {"ours": 0, "theirs": 3}


def test_the_model_codes_boxes_with_it_and_torchvisions_settings(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    model = build_model(
        tiny_config(bbox_reg_weights=(10.0, 10.0, 5.0, 5.0)), num_classes=4, image_size=(128, 128)
    )
    for coder, weights in [
        (model.rpn.box_coder, WEIGHTS[0]),
        (model.roi_heads.box_coder, WEIGHTS[1]),
    ]:
        assert isinstance(coder, HostScalarBoxCoder)
        assert tuple(coder.weights) == weights
        assert coder.bbox_xform_clip == BoxCoder(weights).bbox_xform_clip
