"""Multi-level RoIAlign whose per-level results are merged by one gather.

torchvision's ``MultiScaleRoIAlign`` writes each level's pooled features into a zero tensor
by index (``index_put`` eagerly, and an expanded ``ScatterElements`` over ``[N, C, h, w]``
when traced for ONNX). In the exported graph that scatter, with its ``Expand`` and zero
fill, was a third of onnxruntime's CPU time at 100 detections. Concatenating the levels
and gathering rows back into box order (``[N]`` indices on dim 0) computes the same tensor
with contiguous row copies, eagerly and in ONNX alike.

When training on a CPU each level is pooled by :func:`roi_align_by_gather` instead of
torchvision's kernel, whose backward runs on one thread, box by box: a quarter of a CPU
training step at the demo's sizes, about 3% with the gather (docs/benchmarks.md).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torchvision.ops import MultiScaleRoIAlign, roi_align
from torchvision.ops.boxes import box_area
from torchvision.ops.poolers import LevelMapper, _filter_input, _setup_scales

from .box_coder import values_in


def _bilinear_taps(coords: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Low/high pixel indices and their weights along one axis, as torchvision's kernel.

    Args:
        coords: sample coordinates in feature-map pixels, any shape.
        size: the feature map's extent along this axis.

    Returns:
        ``(low, high, weight_low, weight_high)``, each shaped like ``coords``; both weights
        are zero for a sample more than one pixel outside the map.
    """
    inside = (coords >= -1.0) & (coords <= size)
    coords = coords.clamp(min=0.0)
    low = coords.floor().clamp(max=size - 1)
    at_edge = low >= size - 1
    coords = torch.where(at_edge, low, coords)
    high = torch.where(at_edge, low, low + 1)
    frac = (coords - low) * inside
    return low.long(), high.long(), (1.0 - frac) * inside, frac


def _sample_coords(start: Tensor, bin_size: Tensor, bins: int, grid: int) -> Tensor:
    """``[K, bins * grid]`` sample coordinates, rounded as torchvision's kernel rounds them."""
    arange = functools.partial(torch.arange, device=start.device, dtype=start.dtype)
    bin_offsets = arange(bins)[None, :, None] * bin_size[:, None, None]
    sample_offsets = (arange(grid) + 0.5)[None, None, :] * bin_size[:, None, None] / grid
    return (start[:, None, None] + bin_offsets + sample_offsets).flatten(1)


def _bags(taps: Tensor, output_size: tuple[int, int], grid: int) -> Tensor:
    """``[K, ph*grid, pw*grid, 4]`` taps to one bag per bin: ``[K*ph*pw, grid*grid*4]``."""
    (ph, pw) = output_size
    taps = taps.view(-1, ph, grid, pw, grid, 4).permute(0, 1, 3, 2, 4, 5)
    return taps.reshape(-1, grid * grid * 4)


def roi_align_by_gather(
    feature: Tensor, rois: Tensor, output_size: tuple[int, int], spatial_scale: float,
    sampling_ratio: int,
) -> Tensor:  # fmt: skip
    """torchvision's ``roi_align`` (``aligned=False``) as one weighted gather.

    Every output bin is a weighted sum of at most ``4 * sampling_ratio**2`` feature pixels;
    ``embedding_bag`` computes all of them at once, and its backward is one scatter-add
    that runs on every core, where torchvision's CPU backward loops over boxes on one
    thread (a quarter of a CPU training step). Same samples, weights and edge rules.

    Args:
        feature: ``[B, C, H, W]``.
        rois: ``[K, 5]``: image index, x1, y1, x2, y2 in input-image pixels.
        output_size: (ph, pw) bins per box.
        spatial_scale: the feature map's scale (1 / stride).
        sampling_ratio: sample points per bin side (> 0).

    Returns:
        ``[K, C, ph, pw]``.
    """
    batch, channels, height, width = feature.shape
    (ph, pw), grid = output_size, sampling_ratio
    boxes = rois[:, 1:] * spatial_scale
    sizes = (boxes[:, 2:] - boxes[:, :2]).clamp(min=1.0)  # [K, 2]: roi width, height
    xs = _sample_coords(boxes[:, 0], sizes[:, 0] / pw, pw, grid)  # [K, pw * grid]
    ys = _sample_coords(boxes[:, 1], sizes[:, 1] / ph, ph, grid)  # [K, ph * grid]
    x_lo, x_hi, wx_lo, wx_hi = _bilinear_taps(xs, width)
    y_lo, y_hi, wy_lo, wy_hi = _bilinear_taps(ys, height)
    base = rois[:, 0].long()[:, None, None] * (height * width)  # [K, 1, 1]
    # Taps as [K, ph*grid, pw*grid, 4]: (y_lo, x_lo), (y_lo, x_hi), (y_hi, x_lo), (y_hi, x_hi).
    rows = torch.stack([y_lo, y_lo, y_hi, y_hi], -1)[:, :, None] * width
    cols = torch.stack([x_lo, x_hi, x_lo, x_hi], -1)[:, None]
    weights = (
        torch.stack([wy_lo, wy_lo, wy_hi, wy_hi], -1)[:, :, None]
        * torch.stack([wx_lo, wx_hi, wx_lo, wx_hi], -1)[:, None]
    )
    index = base[..., None] + rows + cols

    # In float32 as torchvision's autocast rule for roi_align computes it.
    table = feature.float().permute(0, 2, 3, 1).reshape(batch * height * width, channels)
    pooled = torch.nn.functional.embedding_bag(
        _bags(index, output_size, grid), table, mode="sum",
        per_sample_weights=(_bags(weights, output_size, grid) / grid**2).float(),
    )  # fmt: skip
    return pooled.view(-1, ph, pw, channels).permute(0, 3, 1, 2).to(feature.dtype)


def _roi_align(
    feature: Tensor, rois: Tensor, output_size: tuple[int, int], spatial_scale: float,
    sampling_ratio: int,
) -> Tensor:  # fmt: skip
    """torchvision's kernel, or the gather when training on a CPU needs its backward."""
    # On CUDA torchvision's backward is parallel (atomic adds): its kernel stays.
    if (
        feature.device.type == "cpu"
        and feature.requires_grad
        and torch.is_grad_enabled()
        and sampling_ratio > 0
        and not torch.jit.is_scripting()
        and not torch.jit.is_tracing()
    ):
        return roi_align_by_gather(feature, rois, output_size, spatial_scale, sampling_ratio)
    return roi_align(
        feature, rois, output_size, spatial_scale=spatial_scale, sampling_ratio=sampling_ratio
    )


def multiscale_roi_align(
    features: list[Tensor],
    boxes: list[Tensor],
    output_size: tuple[int, int],
    sampling_ratio: int,
    scales: list[float],
    mapper: LevelMapper,
) -> Tensor:
    """Pool each box from the FPN level its size maps to.

    Args:
        features: per-level feature maps ``[B, C, H_l, W_l]``, finest first.
        boxes: per image, ``[N_i, 4]`` boxes (x1, y1, x2, y2) in input-image pixels.
        output_size: (h, w) of each pooled feature.
        sampling_ratio: RoIAlign sampling points per bin side.
        scales: feature-map scale of each level (1 / stride).
        mapper: maps boxes to level indices (FPN paper, eq. 1).

    Returns:
        ``[sum(N_i), C, h, w]``, rows in the order of the boxes (image by image).
    """
    rois = torch.cat(
        [torch.cat([torch.full_like(b[:, :1], i), b], dim=1) for i, b in enumerate(boxes)]
    )
    if len(features) == 1:
        return _roi_align(features[0], rois, output_size, scales[0], sampling_ratio)
    dtype = features[0].dtype
    indices = _by_level(mapper(boxes), len(features))
    pooled = [
        _roi_align(feature, rois[index], output_size, scale, sampling_ratio).to(dtype)
        for feature, scale, index in zip(features, scales, indices, strict=True)
    ]
    # Row k of the concatenation is box order[k]; argsort(order) is the inverse permutation.
    return torch.cat(pooled)[torch.argsort(torch.cat(indices))]


def _by_level(levels: Tensor, num_levels: int) -> list[Tensor]:
    """The indices of the boxes of each level, in box order: ``num_levels`` int64 tensors.

    One wait for the device (the levels' counts) where a ``torch.where`` per level waited
    once each. A traced graph (ONNX export) keeps a ``nonzero`` per level instead: the
    counts of the example it is traced on must not become constants of the graph.
    """
    if torch.jit.is_tracing() or torch.jit.is_scripting():
        return [torch.where(levels == level)[0] for level in range(num_levels)]
    order = torch.argsort(levels, stable=True)
    # Counted by comparison, not bincount, whose length (the maximum) is another read.
    each_level = torch.arange(num_levels, device=levels.device)[:, None]
    counts = (levels[None, :] == each_level).sum(dim=1).tolist()
    return list(torch.split(order, counts))


class HostScalarLevelMapper(LevelMapper):
    """torchvision's ``LevelMapper`` (FPN paper, eq. 1), its ``eps`` a Python float.

    torchvision adds ``torch.tensor(eps, dtype=...)``, a tensor made from a Python number
    at every call (two per training step: the box and mask poolers). On a GPU it stays on
    the CPU, a scalar the kernel takes, so no copy; but a CPU run cannot tell it from one
    (:attr:`maskops.training.host_reads.HostReadCounter.from_host`), and the host makes it
    each time. The float is ``eps`` rounded to the boxes' dtype, the value that tensor
    holds: the levels are the same.
    """

    def __call__(self, boxlists: list[Tensor]) -> Tensor:
        """Per box of ``boxlists`` (per image ``[N_i, 4]`` xyxy), in their order: ``[sum
        N_i]`` int64 level index, 0 for ``k_min``."""
        s = torch.sqrt(torch.cat([box_area(boxlist) for boxlist in boxlists]))
        (eps,) = values_in((self.eps,), s.dtype)
        target_lvls = torch.floor(self.lvl0 + torch.log2(s / self.s0) + eps)
        target_lvls = torch.clamp(target_lvls, min=self.k_min, max=self.k_max)
        return (target_lvls.to(torch.int64) - self.k_min).to(torch.int64)


class GatherMultiScaleRoIAlign(MultiScaleRoIAlign):
    """``MultiScaleRoIAlign`` with :func:`multiscale_roi_align` as its merge."""

    def forward(
        self, x: dict[str, Tensor], boxes: list[Tensor], image_shapes: list[tuple[int, int]]
    ) -> Tensor:
        features = _filter_input(x, self.featmap_names)
        # torchvision leaves these attributes untyped.
        scales: list[float] | None = getattr(self, "scales")  # noqa: B009
        mapper: LevelMapper | None = getattr(self, "map_levels")  # noqa: B009
        if scales is None or mapper is None:
            scales, levels = _setup_scales(
                features, image_shapes, self.canonical_scale, self.canonical_level
            )
            mapper = HostScalarLevelMapper(
                levels.k_min, levels.k_max, levels.s0, levels.lvl0, levels.eps
            )
            self.scales, self.map_levels = scales, mapper
        return multiscale_roi_align(
            features, boxes, self.output_size, self.sampling_ratio, scales, mapper
        )
