"""Pruning a filter keeps the constant it still output (bias, BatchNorm shift) in its readers.

Each case gives some filters a zero kernel but a nonzero constant output, prunes exactly
those, and checks that the pruned model computes what the unpruned one did: exactly away
from the zero-padded borders of 3x3 convs (where a constant input cannot be a bias).
Without the compensation every case is off by about the constant's size everywhere.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
import torch
from torch import nn

from maskops.prune import prune_model
from tests.unit.prune.small import make_model

IMAGE = torch.rand(1, 3, 256, 256, generator=torch.Generator().manual_seed(0))


def prune_zero_filters(model: nn.Module) -> nn.Module:
    """A pruned copy: only zero-kernel filters score under the threshold."""
    pruned = copy.deepcopy(model)
    report = prune_model(
        pruned, example_inputs=torch.zeros(1, 3, 128, 128), threshold=0.01, granularity=8
    )
    assert report.macs_after < report.macs_before
    return pruned.eval()


def first_stage(model: nn.Module) -> torch.Tensor:
    """The output of layer1 (the ResNet body's first returned stage)."""
    return next(iter(cast(Any, model.backbone).body(IMAGE).values()))


def interior(x: torch.Tensor) -> torch.Tensor:
    return x[..., 1:-1, 1:-1]


@pytest.mark.parametrize("freeze_bn", [True, False])
@torch.no_grad()
def test_batch_norm_shift_of_a_removed_filter_moves_into_the_next_batch_norm(
    freeze_bn: bool,
) -> None:
    model = make_model(freeze_bn=freeze_bn).eval()
    block = cast(Any, model.backbone).body.layer1[0]
    block.conv1.weight[:32] = 0
    block.bn1.bias.uniform_(0.2, 1.0)  # relu(shift) > 0: what conv2 reads from them
    before = first_stage(model)

    pruned = prune_zero_filters(model)
    assert cast(Any, pruned.backbone).body.layer1[0].conv1.out_channels == 32
    after = first_stage(pruned)
    torch.testing.assert_close(interior(after), interior(before), atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_bias_of_removed_fpn_outputs_moves_into_the_rpn_and_box_heads() -> None:
    model = make_model().eval()
    model_any = cast(Any, model)
    bias = torch.rand(256) - 0.5  # one per channel, shared by the levels as the heads see one
    for conv in model_any.backbone.fpn.layer_blocks.modules():
        if isinstance(conv, nn.Conv2d):
            conv.weight[:128] = 0
            cast(torch.Tensor, conv.bias).copy_(bias)
    boxes = [torch.tensor([[40.0, 40.0, 200.0, 160.0], [64.0, 100.0, 120.0, 220.0]])]

    def heads(m: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
        features = m.backbone(IMAGE)
        objectness, _ = m.rpn.head(list(features.values()))
        pooled = m.roi_heads.box_roi_pool(features, boxes, [(256, 256)])
        return objectness, m.roi_heads.box_head(pooled)

    objectness_before, box_features_before = heads(model_any)
    pruned = prune_zero_filters(model)
    assert cast(Any, pruned.backbone).out_channels == 128
    objectness_after, box_features_after = heads(pruned)

    for after, before in zip(objectness_after, objectness_before, strict=True):
        torch.testing.assert_close(interior(after), interior(before), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(box_features_after, box_features_before, atol=1e-4, rtol=1e-4)
