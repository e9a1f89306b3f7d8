"""The gather-merged multi-level RoIAlign equals torchvision's, forward and backward.

With gradients on (training) each level is pooled by ``roi_align_by_gather``, whose sums
run in another order than torchvision's kernel: equal within float32 rounding. Without
gradients (evaluation, export) torchvision's kernel runs: equal bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import MultiScaleRoIAlign, roi_align
from torchvision.ops.poolers import LevelMapper

from maskops.modeling.poolers import (
    GatherMultiScaleRoIAlign,
    HostScalarLevelMapper,
    _by_level,
    roi_align_by_gather,
)
from maskops.training.host_reads import HostReadCounter

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
    torch.testing.assert_close(ours, reference)

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


def rois_around(feature_side: int, stride: int, count: int, seed: int) -> torch.Tensor:
    """``[count, 5]`` rois on two images, some reaching past every edge of the map."""
    gen = torch.Generator().manual_seed(seed)
    side = feature_side * stride
    xy = torch.rand(count, 2, generator=gen) * (side + 40) - 30
    wh = torch.rand(count, 2, generator=gen) * side * 0.7
    wh[: count // 4] = torch.rand(count // 4, 2, generator=gen) * 0.5  # under one pixel
    image = torch.randint(0, 2, (count, 1), generator=gen).float()
    return torch.cat([image, xy, xy + wh], dim=1)


@pytest.mark.parametrize(("output", "sampling"), [((7, 7), 2), ((8, 8), 2), ((5, 3), 3)])
def test_gather_equals_torchvision_at_the_edges(output: tuple[int, int], sampling: int) -> None:
    feature = torch.randn(2, 6, 16, 12, generator=torch.Generator().manual_seed(4))
    rois = rois_around(16, 8, 64, seed=5)
    reference_input = feature.clone().requires_grad_(True)
    ours_input = feature.clone().requires_grad_(True)
    reference = roi_align(reference_input, rois, output, 1 / 8, sampling)
    ours = roi_align_by_gather(ours_input, rois, output, 1 / 8, sampling)
    torch.testing.assert_close(ours, reference)
    weights = torch.randn(reference.shape, generator=torch.Generator().manual_seed(6))
    (reference * weights).sum().backward()
    (ours * weights).sum().backward()
    torch.testing.assert_close(ours_input.grad, reference_input.grad)


def test_gather_under_bf16_autocast_computes_in_float32_as_torchvision() -> None:
    feature = torch.randn(2, 6, 16, 16, generator=torch.Generator().manual_seed(7))
    low = feature.bfloat16().requires_grad_(True)
    rois = rois_around(16, 8, 32, seed=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = roi_align(low, rois, (7, 7), 1 / 8, 2)
        ours = roi_align_by_gather(low, rois, (7, 7), 1 / 8, 2)
    assert ours.dtype == reference.dtype == torch.bfloat16
    torch.testing.assert_close(ours, reference)
    ours.float().sum().backward()
    assert low.grad is not None and low.grad.dtype == torch.bfloat16


def test_no_rois_pool_to_an_empty_batch() -> None:
    feature = torch.randn(2, 6, 16, 16, requires_grad=True)
    pooled = roi_align_by_gather(feature, torch.zeros(0, 5), (7, 7), 1 / 8, 2)
    assert pooled.shape == (0, 6, 7, 7)
    pooled.sum().backward()
    assert feature.grad is not None and not feature.grad.any()


def test_boxes_are_split_by_level_in_box_order_with_one_count() -> None:
    levels = torch.randint(0, 4, (200,), generator=torch.Generator().manual_seed(4))
    levels[:3] = 3  # level 0 may be empty below: an empty level is an empty index
    for present in (levels, levels.clamp(min=1)):
        split = _by_level(present, 4)
        expected = [torch.where(present == level)[0] for level in range(4)]
        assert [s.tolist() for s in split] == [e.tolist() for e in expected]


def test_a_traced_pooler_follows_the_levels_of_other_boxes() -> None:
    """A traced graph (ONNX export traces the model) must not keep the per-level counts of
    the boxes it was traced on."""
    pooler = GatherMultiScaleRoIAlign(LEVELS, 7, 2).eval()
    feats = features(0)

    def pool(*maps_and_rois: torch.Tensor) -> torch.Tensor:
        *maps, rois = maps_and_rois
        return pooler(dict(zip(LEVELS, maps, strict=True)), [rois], [IMAGE])

    traced_on, other = boxes((20,), 40.0, seed=5)[0], boxes((30,), 200.0, seed=6)[0]
    with torch.no_grad():
        traced = torch.jit.trace(pool, (*feats.values(), traced_on), check_trace=False)
        torch.testing.assert_close(traced(*feats.values(), other), pool(*feats.values(), other))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_level_mapping_is_torchvisions_without_a_tensor_from_host_data(
    dtype: torch.dtype,
) -> None:
    """Random boxes, and square ones whose side is the canonical 224 times a power of two,
    on a level's boundary to within ``eps``: the levels torchvision's mapper gives."""
    reference = LevelMapper(2, 5)
    ours = HostScalarLevelMapper(2, 5)
    random_boxes = boxes((300, 200), 400.0, seed=9)
    sides = torch.tensor([56.0, 112.0, 224.0, 448.0, 896.0])
    edge_sides = torch.cat([sides, sides * (1 - 1e-6), sides * (1 + 1e-6), sides * 0.999])
    on_edges = torch.cat([torch.zeros(len(edge_sides), 2), edge_sides[:, None].expand(-1, 2)], 1)
    for rois in [[b.to(dtype) for b in random_boxes], [on_edges.to(dtype)]]:
        with HostReadCounter() as reads:
            got = ours(rois)
        assert reads.from_host == 0, reads.from_host_by_call
        assert torch.equal(got, reference(rois))


def test_a_pooler_maps_levels_with_python_scalars() -> None:
    pooler = GatherMultiScaleRoIAlign(LEVELS, 7, 2)
    pooler(features(0), boxes((3, 2), 100.0, seed=10), [IMAGE] * 2)
    assert isinstance(pooler.map_levels, HostScalarLevelMapper)
    assert (pooler.map_levels.k_min, pooler.map_levels.k_max) == (2, 5)
