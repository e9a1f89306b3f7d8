"""ResNet + FPN backbones over FPN levels ``min_level..max_level``.

Level ``l`` has stride ``2**l``: levels 2..5 are the FPN outputs over ResNet stages
layer1..layer4 (C2..C5); levels above 5 are stride-2 subsamplings of the level below, as
torchvision's ``LastLevelMaxPool`` does for its single extra level. Feature maps are named
``"p{level}"``. Weights are always randomly initialised here; pretrained weights come from a
local file through :func:`maskops.checkpoints.pretrained.load_weights_into`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models import resnet
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.ops.feature_pyramid_network import ExtraFPNBlock
from torchvision.ops.misc import FrozenBatchNorm2d

FPN_CHANNELS = 256
"""Channels of every FPN level (TAO and torchvision both use 256)."""

BACKBONE_LEVELS = (2, 3, 4, 5)
"""The FPN levels that come from ResNet stages (layer1..layer4)."""

_RESNET_LAYOUT: dict[int, tuple[type[resnet.BasicBlock] | type[resnet.Bottleneck], list[int]]] = {
    10: (resnet.BasicBlock, [1, 1, 1, 1]),
    18: (resnet.BasicBlock, [2, 2, 2, 2]),
    34: (resnet.BasicBlock, [3, 4, 6, 3]),
    50: (resnet.Bottleneck, [3, 4, 6, 3]),
    101: (resnet.Bottleneck, [3, 4, 23, 3]),
}

FREEZE_BLOCK_MODULES: dict[int, tuple[str, ...]] = {
    0: ("conv1", "bn1"),
    1: ("layer1",),
    2: ("layer2",),
    3: ("layer3",),
}
"""TAO's freeze_blocks numbering: 0 is the stem, 1..3 the first three residual stages."""


class ExtraMaxPoolLevels(ExtraFPNBlock):
    """Appends ``num_levels`` levels, each a stride-2 subsampling of the previous one.

    ``num_levels == 1`` is exactly torchvision's ``LastLevelMaxPool`` (kernel 1, stride 2).
    """

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = list(names)

    def forward(
        self, results: list[Tensor], x: list[Tensor], names: list[str]
    ) -> tuple[list[Tensor], list[str]]:
        for name in self.names:
            results.append(F.max_pool2d(results[-1], kernel_size=1, stride=2, padding=0))
            names.append(name)
        return results, names


def build_resnet(*, nlayers: int, norm_layer: Callable[..., nn.Module]) -> resnet.ResNet:
    """A randomly initialised torchvision ResNet; ResNet-10 is BasicBlock x [1, 1, 1, 1]."""
    if nlayers not in _RESNET_LAYOUT:
        raise ValueError(f"nlayers must be one of {sorted(_RESNET_LAYOUT)}, got {nlayers}")
    block, layers = _RESNET_LAYOUT[nlayers]
    return resnet.ResNet(block, layers, norm_layer=norm_layer)


def _freeze_module(module: nn.Module) -> nn.Module:
    """``module`` with its BatchNorm2d layers turned into FrozenBatchNorm2d and no grads.

    A frozen block must not change during training at all: its parameters get no gradient
    and its batch-norm statistics must not move either, which a train-mode BatchNorm2d
    would do.
    """
    frozen = _to_frozen_bn(module)
    for param in frozen.parameters():
        param.requires_grad_(False)
    return frozen


def _to_frozen_bn(module: nn.Module) -> nn.Module:
    if isinstance(module, nn.BatchNorm2d):
        frozen = FrozenBatchNorm2d(module.num_features, eps=module.eps)
        if module.weight is not None:
            frozen.weight.copy_(module.weight.detach())
            frozen.bias.copy_(module.bias.detach())
        if module.running_mean is not None and module.running_var is not None:
            frozen.running_mean.copy_(module.running_mean)
            frozen.running_var.copy_(module.running_var)
        return frozen
    for name, child in module.named_children():
        setattr(module, name, _to_frozen_bn(child))
    return module


def build_resnet_fpn_backbone(
    *,
    nlayers: int,
    min_level: int,
    max_level: int,
    freeze_bn: bool,
    freeze_blocks: Collection[int],
) -> BackboneWithFPN:
    """ResNet-``nlayers`` with an FPN producing levels ``min_level..max_level``.

    Args:
        nlayers: 10, 18, 34, 50 or 101.
        min_level: finest FPN level, 2..5 (stride ``2**min_level``).
        max_level: coarsest FPN level, > min_level; levels above 5 are max-pool levels.
        freeze_bn: FrozenBatchNorm2d instead of BatchNorm2d throughout the ResNet.
        freeze_blocks: TAO numbering (see ``FREEZE_BLOCK_MODULES``): those modules get
            ``requires_grad=False`` and frozen batch norm.

    Returns:
        A torchvision ``BackboneWithFPN`` (``body`` = ResNet stages, ``fpn``) whose forward
        maps ``[B, 3, H, W]`` to an ordered dict ``{"p{l}": [B, 256, H / 2**l, W / 2**l]}``.
    """
    if not BACKBONE_LEVELS[0] <= min_level <= BACKBONE_LEVELS[-1]:
        raise ValueError(f"min_level must be in 2..5, got {min_level}")
    if max_level <= min_level:
        raise ValueError(f"max_level ({max_level}) must be greater than min_level ({min_level})")
    unknown = sorted(set(freeze_blocks) - set(FREEZE_BLOCK_MODULES))
    if unknown:
        raise ValueError(f"freeze_blocks must be a subset of [0, 1, 2, 3], got {unknown}")

    norm_layer: Callable[..., nn.Module] = FrozenBatchNorm2d if freeze_bn else nn.BatchNorm2d
    body = build_resnet(nlayers=nlayers, norm_layer=norm_layer)
    for block in sorted(set(freeze_blocks)):
        for name in FREEZE_BLOCK_MODULES[block]:
            setattr(body, name, _freeze_module(getattr(body, name)))

    stage_levels = [lvl for lvl in BACKBONE_LEVELS if min_level <= lvl <= max_level]
    # layerK produces level K + 1; IntermediateLayerGetter drops every stage after the last
    # one returned, so a max_level below 5 also removes the unused deeper stages.
    return_layers = {f"layer{lvl - 1}": f"p{lvl}" for lvl in stage_levels}
    stage_channels = {lvl: body.inplanes // 2 ** (5 - lvl) for lvl in stage_levels}
    extra = ExtraMaxPoolLevels([f"p{lvl}" for lvl in range(BACKBONE_LEVELS[-1] + 1, max_level + 1)])
    return BackboneWithFPN(
        body,
        return_layers=return_layers,
        in_channels_list=[stage_channels[lvl] for lvl in stage_levels],
        out_channels=FPN_CHANNELS,
        extra_blocks=extra,
    )
