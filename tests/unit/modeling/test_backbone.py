"""ResNet + FPN backbone: levels, depths, freeze_bn and freeze_blocks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.resnet import BasicBlock, Bottleneck
from torchvision.ops.misc import FrozenBatchNorm2d

from maskops.modeling import build_resnet_fpn_backbone


def _backbone(**overrides: object) -> BackboneWithFPN:
    kwargs: dict[str, object] = {
        "nlayers": 10,
        "min_level": 2,
        "max_level": 6,
        "freeze_bn": False,
        "freeze_blocks": [],
    }
    kwargs.update(overrides)
    return build_resnet_fpn_backbone(**kwargs)  # type: ignore[arg-type]


def _body(**overrides: object) -> nn.Module:
    body = _backbone(**overrides).body
    assert isinstance(body, nn.Module)
    return body


@pytest.mark.parametrize(
    ("min_level", "max_level", "expected"),
    [
        (2, 6, ["p2", "p3", "p4", "p5", "p6"]),
        (3, 7, ["p3", "p4", "p5", "p6", "p7"]),
        (2, 4, ["p2", "p3", "p4"]),
        (3, 5, ["p3", "p4", "p5"]),
    ],
)
def test_fpn_levels_and_strides(min_level: int, max_level: int, expected: list[str]) -> None:
    backbone = _backbone(min_level=min_level, max_level=max_level).eval()
    with torch.no_grad():
        features = backbone(torch.rand(1, 3, 128, 256))
    assert list(features) == expected
    for name, feature in features.items():
        stride = 2 ** int(name[1:])
        assert feature.shape == (1, 256, 128 // stride, 256 // stride)
    # A max_level below 5 drops the ResNet stages nobody uses.
    assert hasattr(backbone.body, "layer4") == (max_level >= 5)


@pytest.mark.parametrize(
    ("nlayers", "block", "layout"),
    [
        (10, BasicBlock, [1, 1, 1, 1]),
        (18, BasicBlock, [2, 2, 2, 2]),
        (34, BasicBlock, [3, 4, 6, 3]),
        (50, Bottleneck, [3, 4, 6, 3]),
        (101, Bottleneck, [3, 4, 23, 3]),
    ],
)
def test_resnet_depths(nlayers: int, block: type, layout: list[int]) -> None:
    body = _body(nlayers=nlayers)
    stages = [getattr(body, f"layer{i}") for i in range(1, 5)]
    assert [len(stage) for stage in stages] == layout
    assert all(isinstance(b, block) for stage in stages for b in stage)


def test_unknown_depth_and_levels_are_rejected() -> None:
    with pytest.raises(ValueError, match="nlayers"):
        _backbone(nlayers=42)
    with pytest.raises(ValueError, match="max_level"):
        _backbone(min_level=4, max_level=4)
    with pytest.raises(ValueError, match="min_level"):
        _backbone(min_level=1)
    with pytest.raises(ValueError, match="freeze_blocks"):
        _backbone(freeze_blocks=[4])


def test_freeze_bn_uses_frozen_batch_norm_everywhere_in_the_resnet() -> None:
    frozen = _body(freeze_bn=True)
    trainable = _body(freeze_bn=False)
    # ResNet-10: the stem, two per BasicBlock (8) and three downsample shortcuts.
    assert not any(isinstance(m, nn.BatchNorm2d) for m in frozen.modules())
    assert sum(isinstance(m, FrozenBatchNorm2d) for m in frozen.modules()) == 12
    assert not any(isinstance(m, FrozenBatchNorm2d) for m in trainable.modules())
    assert sum(isinstance(m, nn.BatchNorm2d) for m in trainable.modules()) == 12


@pytest.mark.parametrize(
    ("blocks", "frozen_prefixes"),
    [
        ([0], ("conv1", "bn1")),
        ([1], ("layer1",)),
        ([0, 1, 2], ("conv1", "bn1", "layer1", "layer2")),
        ([3], ("layer3",)),
    ],
)
def test_freeze_blocks_follow_tao_numbering(
    blocks: list[int], frozen_prefixes: tuple[str, ...]
) -> None:
    body = _body(freeze_blocks=blocks)
    for name, param in body.named_parameters():
        assert param.requires_grad == (not name.startswith(frozen_prefixes)), name
    for name, module in body.named_modules():
        if name.startswith(frozen_prefixes) and "bn" in name.split(".")[-1]:
            assert isinstance(module, FrozenBatchNorm2d), name


@pytest.mark.parametrize("freeze_bn", [False, True])
def test_frozen_blocks_are_bit_identical_after_training_steps(freeze_bn: bool) -> None:
    torch.manual_seed(0)
    backbone = _backbone(freeze_blocks=[0, 1], freeze_bn=freeze_bn).train()
    frozen_prefixes = ("body.conv1", "body.bn1", "body.layer1")
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    params = [p for p in backbone.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        loss = sum(f.square().mean() for f in backbone(torch.rand(2, 3, 64, 64)).values())
        loss.backward()
        optimizer.step()
    after = backbone.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    # Frozen blocks: weights and batch-norm statistics untouched; the rest trained.
    assert not {k for k in changed if k.startswith(frozen_prefixes)}
    assert any(k.startswith("body.layer2") for k in changed)
    assert any(k.startswith("fpn.") for k in changed)
    if freeze_bn:
        assert not any("running_" in k for k in changed)
