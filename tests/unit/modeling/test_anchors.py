"""Anchors follow the TF/TAO convention numerically (see maskops.modeling.anchors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torchvision.models.detection.image_list import ImageList

from maskops.modeling import LevelAnchorGenerator, cell_anchors_for_level
from maskops.training.host_reads import HostReadCounter


def tf_reference_anchors(
    image_size: tuple[int, int],
    levels: list[int],
    num_scales: int,
    aspect_ratios: list[tuple[float, float]],
    anchor_scale: float,
) -> np.ndarray:
    """TF Mask R-CNN's ``_generate_anchor_boxes`` (tpu/models/official/mask_rcnn/anchors.py),
    transcribed, with its ``[y1, x1, y2, x2]`` output turned into ``[x1, y1, x2, y2]``."""
    boxes_all = []
    for level in levels:
        boxes_level = []
        for scale_octave in range(num_scales):
            for aspect in aspect_ratios:
                stride = 2**level
                base_anchor_size = anchor_scale * stride * 2 ** (scale_octave / float(num_scales))
                anchor_size_x_2 = base_anchor_size * aspect[0] / 2.0
                anchor_size_y_2 = base_anchor_size * aspect[1] / 2.0
                x = np.arange(stride / 2, image_size[1], stride)
                y = np.arange(stride / 2, image_size[0], stride)
                grid_x, grid_y = np.meshgrid(x, y)
                xv, yv = grid_x.reshape(-1), grid_y.reshape(-1)
                boxes = np.vstack(
                    (
                        yv - anchor_size_y_2,
                        xv - anchor_size_x_2,
                        yv + anchor_size_y_2,
                        xv + anchor_size_x_2,
                    )
                )
                boxes_level.append(np.swapaxes(boxes, 0, 1))
        boxes_all.append(np.stack(boxes_level, axis=1).reshape([-1, 4]))
    yxyx = np.vstack(boxes_all)
    return yxyx[:, [1, 0, 3, 2]]


def _generate(
    gen: LevelAnchorGenerator, image_size: tuple[int, int], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    height, width = image_size
    images = ImageList(torch.zeros(1, 3, height, width), [image_size])
    features = [
        torch.zeros(1, 8, height // 2**lvl, width // 2**lvl, dtype=dtype) for lvl in gen.levels
    ]
    return gen(images, features)[0]


def test_default_level2_anchor_shapes_follow_tf_aspect_convention() -> None:
    cell = cell_anchors_for_level(
        level=2, anchor_scale=8.0, num_scales=1, aspect_ratios=[(1.0, 1.0), (1.4, 0.7), (0.7, 1.4)]
    )
    widths = cell[:, 2] - cell[:, 0]
    heights = cell[:, 3] - cell[:, 1]
    # Base anchor at level 2 = 8 * 2**2 = 32 px; (x, y) scales width by x and height by y.
    torch.testing.assert_close(widths, torch.tensor([32.0, 44.8, 22.4]))
    torch.testing.assert_close(heights, torch.tensor([32.0, 22.4, 44.8]))
    # (1.4, 0.7) is torchvision's aspect ratio h/w = 0.5, with ~the same area (0.98x).
    assert heights[1] / widths[1] == pytest.approx(0.5)
    assert (widths[1] * heights[1]) / (32.0 * 32.0) == pytest.approx(0.98)
    # The cell anchor is centred on the first cell's centre, stride / 2 = 2 px.
    torch.testing.assert_close((cell[:, 0] + cell[:, 2]) / 2, torch.full((3,), 2.0))
    torch.testing.assert_close((cell[:, 1] + cell[:, 3]) / 2, torch.full((3,), 2.0))


def test_octave_scales_and_anchor_scale() -> None:
    cell = cell_anchors_for_level(
        level=3, anchor_scale=4.0, num_scales=3, aspect_ratios=[(1.0, 1.0)]
    )
    widths = (cell[:, 2] - cell[:, 0]).tolist()
    base = 4.0 * 2**3
    assert widths == pytest.approx([base, base * 2 ** (1 / 3), base * 2 ** (2 / 3)])


@pytest.mark.parametrize(
    ("image_size", "levels", "num_scales", "aspect_ratios", "anchor_scale"),
    [
        ((128, 128), [2, 3, 4, 5, 6], 1, [(1.0, 1.0), (1.4, 0.7), (0.7, 1.4)], 8.0),
        ((128, 256), [3, 4, 5, 6, 7], 2, [(1.0, 1.0), (2.0, 0.5)], 4.0),
    ],
)
def test_generator_matches_tf_reference_exactly(
    image_size: tuple[int, int],
    levels: list[int],
    num_scales: int,
    aspect_ratios: list[tuple[float, float]],
    anchor_scale: float,
) -> None:
    gen = LevelAnchorGenerator(
        levels=levels, anchor_scale=anchor_scale, num_scales=num_scales, aspect_ratios=aspect_ratios
    )
    ours = _generate(gen, image_size)
    expected = tf_reference_anchors(image_size, levels, num_scales, aspect_ratios, anchor_scale)
    per_cell = num_scales * len(aspect_ratios)
    assert gen.num_anchors_per_location() == [per_cell] * len(levels)
    count = sum(
        math.ceil(image_size[0] / 2**lvl) * math.ceil(image_size[1] / 2**lvl) for lvl in levels
    )
    assert ours.shape == (count * per_cell, 4)
    # Same boxes in the same order (position-major, octave then aspect within a cell).
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_anchors_stay_float32_under_half_precision_features(dtype: torch.dtype) -> None:
    """Under autocast the feature maps are bf16/fp16; anchors in bf16 would be up to 4 px
    off at TAO's 832x1344 (8 significant bits), and torchvision would keep the rounded
    cell anchors for later float32 calls."""
    levels, ratios = [2, 3, 4, 5, 6], [(1.0, 1.0), (1.4, 0.7), (0.7, 1.4)]
    gen = LevelAnchorGenerator(levels=levels, anchor_scale=8.0, num_scales=1, aspect_ratios=ratios)
    half = _generate(gen, (832, 1344), dtype)
    assert half.dtype == torch.float32
    expected = tf_reference_anchors((832, 1344), levels, 1, ratios, 8.0)
    np.testing.assert_allclose(half.numpy(), expected, atol=1e-3)
    assert all(cell.dtype == torch.float32 for cell in gen.cell_anchors)
    np.testing.assert_allclose(_generate(gen, (832, 1344)).numpy(), expected, atol=1e-3)


def _inputs(
    gen: LevelAnchorGenerator, image_size: tuple[int, int], images: int
) -> tuple[ImageList, list[Tensor]]:
    height, width = image_size
    batch = ImageList(torch.zeros(images, 3, height, width), [image_size] * images)
    features = [torch.zeros(images, 8, height // 2**lvl, width // 2**lvl) for lvl in gen.levels]
    return batch, features


def test_anchors_are_made_once_per_padded_size() -> None:
    """A fixed-size run's steps reuse the anchors: no operator at all after the first."""
    levels, ratios = [3, 4, 5], [(1.0, 1.0), (1.4, 0.7)]
    gen = LevelAnchorGenerator(levels=levels, anchor_scale=2.0, num_scales=2, aspect_ratios=ratios)
    first = gen(*_inputs(gen, (64, 96), images=2))
    expected = torch.from_numpy(tf_reference_anchors((64, 96), levels, 2, ratios, 2.0)).float()
    assert len(first) == 2
    for anchors in first:
        torch.testing.assert_close(anchors, expected, atol=1e-4, rtol=0)
    batch, features = _inputs(gen, (64, 96), images=3)
    with HostReadCounter() as counted:
        again = gen(batch, features)
    assert counted.operators == 0
    assert len(again) == 3 and all(anchors is first[0] for anchors in again)
    other = gen(*_inputs(gen, (96, 64), images=1))[0]
    expected = torch.from_numpy(tf_reference_anchors((96, 64), levels, 2, ratios, 2.0)).float()
    torch.testing.assert_close(other, expected, atol=1e-4, rtol=0)


def test_a_traced_graph_makes_its_anchors_from_the_input() -> None:
    """ONNX export traces: the graph computes the anchors (``arange`` over the feature
    map's size), not a constant of the size the model last saw."""
    gen = LevelAnchorGenerator(
        levels=[3, 4], anchor_scale=2.0, num_scales=1, aspect_ratios=[(1.0, 1.0)]
    )
    gen(*_inputs(gen, (64, 64), images=1))  # kept before the trace

    class Anchors(nn.Module):
        def forward(self, images: Tensor) -> Tensor:
            features = [images[:, :, :: 2**lvl, :: 2**lvl] for lvl in gen.levels]
            return gen(ImageList(images, [(64, 64)]), features)[0]

    traced = torch.jit.trace(Anchors(), torch.zeros(1, 3, 64, 64))
    assert "aten::arange" in str(traced.graph)


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_scales"):
        LevelAnchorGenerator(levels=[2], anchor_scale=8.0, num_scales=0, aspect_ratios=[(1.0, 1.0)])
    with pytest.raises(ValueError, match="aspect_ratios"):
        LevelAnchorGenerator(levels=[2], anchor_scale=8.0, num_scales=1, aspect_ratios=[])
