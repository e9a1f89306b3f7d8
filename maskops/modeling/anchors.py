"""Anchors in the TF/TAO Mask R-CNN convention, on top of torchvision's AnchorGenerator.

torchvision's ``AnchorGenerator`` keeps an anchor's area fixed across aspect ratios
(``h/w = ratio``, ``w = size / sqrt(ratio)``), rounds the corners to integers and centres
anchors on ``k * stride``. The TF Mask R-CNN that TAO wraps does none of that: for FPN
level ``l`` (stride ``2**l``), octave ``i < num_scales`` and aspect tuple ``(x, y)``

    base  = anchor_scale * 2**l * 2**(i / num_scales)
    width = base * x,  height = base * y
    centre = (stride / 2 + k * stride) on both axes

so ``(1.4, 0.7)`` is a wide anchor of area ``0.98 * base**2`` (torchvision ratio
``h/w = y/x = 0.5``). :class:`LevelAnchorGenerator` produces exactly these boxes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.image_list import ImageList


def cell_anchors_for_level(
    *,
    level: int,
    anchor_scale: float,
    num_scales: int,
    aspect_ratios: Sequence[tuple[float, float]],
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The anchors of one grid cell of FPN level ``level``, for the cell at the origin.

    Returns:
        ``[num_scales * len(aspect_ratios), 4]`` xyxy boxes in input pixels, centred on
        ``(stride / 2, stride / 2)``; octave-major, aspect-minor (TF order).
    """
    stride = 2.0**level
    rows = []
    for octave in range(num_scales):
        base = anchor_scale * stride * 2.0 ** (octave / num_scales)
        for x, y in aspect_ratios:
            half_w, half_h = base * x / 2.0, base * y / 2.0
            centre = stride / 2.0
            rows.append([centre - half_w, centre - half_h, centre + half_w, centre + half_h])
    return torch.tensor(rows, dtype=dtype)


class LevelAnchorGenerator(AnchorGenerator):
    """torchvision's anchor tiling with TF/TAO cell anchors (see the module docstring).

    One entry of ``levels`` per feature map the RPN sees, in the same order. The tiling
    (``grid_anchors``/``forward``) is torchvision's: it offsets each cell anchor by
    ``k * stride`` with the stride inferred from the feature-map size, which equals
    ``2**level`` because the transform pads inputs to a multiple of ``2**max_level``.

    The anchors of the last padded size are kept (:meth:`forward`): a run at TAO's fixed
    ``image_size`` makes them once, not again at every step (about a hundred operators a
    step, host work a GPU would otherwise wait for).
    """

    def __init__(
        self,
        *,
        levels: Sequence[int],
        anchor_scale: float,
        num_scales: int,
        aspect_ratios: Sequence[tuple[float, float]],
    ) -> None:
        if num_scales < 1:
            raise ValueError(f"num_scales must be >= 1, got {num_scales}")
        if not aspect_ratios:
            raise ValueError("aspect_ratios must not be empty")
        if anchor_scale <= 0:
            raise ValueError(f"anchor_scale must be > 0, got {anchor_scale}")
        # torchvision's constructor only records sizes/ratios and builds its own cell anchors,
        # which are replaced right below; the sizes are kept for introspection (repr, tests).
        sizes = tuple(
            tuple(anchor_scale * 2.0**lvl * 2.0 ** (i / num_scales) for i in range(num_scales))
            for lvl in levels
        )
        ratios = tuple(tuple(y / x for x, y in aspect_ratios) for _ in levels)
        super().__init__(sizes=sizes, aspect_ratios=ratios)
        self.levels = tuple(levels)
        self.anchor_scale = float(anchor_scale)
        self.num_scales = int(num_scales)
        self.tf_aspect_ratios = tuple((float(x), float(y)) for x, y in aspect_ratios)
        self.cell_anchors = [
            cell_anchors_for_level(
                level=lvl,
                anchor_scale=anchor_scale,
                num_scales=num_scales,
                aspect_ratios=aspect_ratios,
            )
            for lvl in levels
        ]
        self._kept: tuple[tuple[object, ...], Tensor] | None = None

    def forward(self, image_list: ImageList, feature_maps: list[Tensor]) -> list[Tensor]:
        """torchvision's anchors, one ``[A, 4]`` xyxy float32 tensor per image, all the
        same: the images of a batch share their padded size.

        The anchors of the last padded size, feature-map sizes and device are reused, the
        same tensor for every image (no caller writes into anchors). Tracing (ONNX export
        traces) and compiling compute them anew, so that a graph keeps making them from
        its input's shape.
        """
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            return super().forward(image_list, feature_maps)
        key = (
            tuple(image_list.tensors.shape[-2:]),
            tuple(tuple(feature.shape[-2:]) for feature in feature_maps),
            feature_maps[0].device,
        )
        if self._kept is None or self._kept[0] != key:
            first = ImageList(image_list.tensors[:1], image_list.image_sizes[:1])
            (anchors,) = super().forward(first, feature_maps)
            self._kept = (key, anchors)
        return [self._kept[1]] * len(image_list.image_sizes)

    def set_cell_anchors(self, dtype: torch.dtype, device: torch.device) -> None:
        """Keep the cell anchors in float32 whatever ``dtype`` the features have.

        torchvision makes anchors in the feature maps' dtype: bf16 under autocast, whose 8
        significant bits put an anchor at x = 1300 up to 4 px off (and torchvision keeps
        the rounded copy for later float32 calls). Anchors are coordinates: box encoding
        and decoding, which run in float32 (see :mod:`maskops.modeling.heads`), need them
        exact.
        """
        del dtype
        super().set_cell_anchors(torch.float32, device)

    def num_anchors_per_location(self) -> list[int]:
        return [self.num_scales * len(self.tf_aspect_ratios)] * len(self.levels)
