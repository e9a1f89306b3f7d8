"""The gather-merged multi-level RoIAlign equals torchvision's, forward and backward."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import MultiScaleRoIAlign

from maskops.modeling.poolers import GatherMultiScaleRoIAlign

LEVELS = ["p2", "p3", "p4", "p5"]
IMAGE = (256, 320)


def features(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(2, 8, IMAGE[0] // 4 // 2**i, IMAGE[1] // 4 // 2**i, generator=gen)
        for i, name in enumerate(LEVELS)
    }


def boxes(counts: tuple[int, ...], max_side: float, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in counts:
        xy = torch.rand(n, 2, generator=gen) * 180
        wh = torch.rand(n, 2, generator=gen) * max_side + 2
        out.append(torch.cat([xy, xy + wh], dim=1))
    return out


@pytest.mark.parametrize(
    ("counts", "max_side"),
    [((30, 17), 140.0), ((5, 0), 10.0), ((1, 1), 300.0), ((40, 40), 40.0)],
    ids=["all-levels", "one-level-and-an-empty-image", "single-boxes", "small-boxes"],
)
def test_matches_torchvision_forward_and_backward(counts: tuple[int, ...], max_side: float) -> None:
    reference_features, ours_features = features(0), features(0)
    for tensors in (reference_features, ours_features):
        for t in tensors.values():
            t.requires_grad_(True)
    rois = boxes(counts, max_side, seed=1)
    shapes = [IMAGE] * 2
    reference = MultiScaleRoIAlign(LEVELS, 7, 2)(reference_features, rois, shapes)
    ours = GatherMultiScaleRoIAlign(LEVELS, 7, 2)(ours_features, rois, shapes)
    assert ours.shape == reference.shape == (sum(counts), 8, 7, 7)
    torch.testing.assert_close(ours, reference, rtol=0, atol=0)

    weights = torch.randn(reference.shape, generator=torch.Generator().manual_seed(2))
    (reference * weights).sum().backward()
    (ours * weights).sum().backward()
    for name in LEVELS:
        grad_ours, grad_reference = ours_features[name].grad, reference_features[name].grad
        assert grad_ours is not None and grad_reference is not None
        torch.testing.assert_close(grad_ours, grad_reference)


def test_single_level_pools_directly() -> None:
    feats = {"p3": features(0)["p3"]}
    rois = boxes((6, 3), 60.0, seed=3)
    reference = MultiScaleRoIAlign(["p3"], 14, 2)(feats, rois, [IMAGE] * 2)
    ours = GatherMultiScaleRoIAlign(["p3"], 14, 2)(feats, rois, [IMAGE] * 2)
    torch.testing.assert_close(ours, reference, rtol=0, atol=0)
