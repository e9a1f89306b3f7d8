"""COCO checkpoints of mmdetection load under this model's names, class rows reordered;
detectron2's, caffe-style, other depths and layers this model lacks are refused by name.

The mmdetection file is a small random model written under mmdetection's own names (the
table below, from its ``mask_rcnn_r50_fpn`` state dict: ``neck.lateral_convs.0.conv``,
``roi_head.bbox_head.fc_cls``...), with its class order: background last, no background
row in the box deltas and mask logits.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from maskops.checkpoints.model_file import CheckpointError
from maskops.checkpoints.pretrained import load_weights_into
from maskops.modeling import build_model
from maskops.spec.models import MaskRCNNConfig

TO_MMDET = [
    (r"^backbone\.body\.(.+)$", r"backbone.\1"),
    (r"^backbone\.fpn\.inner_blocks\.(\d)\.0\.(.+)$", r"neck.lateral_convs.\1.conv.\2"),
    (r"^backbone\.fpn\.layer_blocks\.(\d)\.0\.(.+)$", r"neck.fpn_convs.\1.conv.\2"),
    (r"^rpn\.head\.conv\.0\.0\.(.+)$", r"rpn_head.rpn_conv.\1"),
    (r"^rpn\.head\.cls_logits\.(.+)$", r"rpn_head.rpn_cls.\1"),
    (r"^rpn\.head\.bbox_pred\.(.+)$", r"rpn_head.rpn_reg.\1"),
    (r"^roi_heads\.box_head\.fc6\.(.+)$", r"roi_head.bbox_head.shared_fcs.0.\1"),
    (r"^roi_heads\.box_head\.fc7\.(.+)$", r"roi_head.bbox_head.shared_fcs.1.\1"),
    (r"^roi_heads\.box_predictor\.cls_score\.(.+)$", r"roi_head.bbox_head.fc_cls.\1"),
    (r"^roi_heads\.box_predictor\.bbox_pred\.(.+)$", r"roi_head.bbox_head.fc_reg.\1"),
    (r"^roi_heads\.mask_head\.(\d)\.0\.(.+)$", r"roi_head.mask_head.convs.\1.conv.\2"),
    (r"^roi_heads\.mask_predictor\.conv5_mask\.(.+)$", r"roi_head.mask_head.upsample.\1"),
    (r"^roi_heads\.mask_predictor\.mask_fcn_logits\.(.+)$", r"roi_head.mask_head.conv_logits.\1"),
]
PYTORCH_CONFIG = "model = dict(type='MaskRCNN', backbone=dict(type='ResNet', style='pytorch'))"


def _mmdet_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights as mmdetection stores them."""
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if key.endswith(("cls_score.weight", "cls_score.bias")):
            value = torch.cat([value[1:], value[:1]])  # background last
        elif key.endswith(("bbox_pred.weight", "bbox_pred.bias")) and "roi_heads" in key:
            value = value[4:]  # no background deltas
        elif key.endswith(("mask_fcn_logits.weight", "mask_fcn_logits.bias")):
            value = value[1:]
        names = [re.sub(p, r, key) for p, r in TO_MMDET if re.match(p, key)]
        assert names, key
        out[names[0]] = value
    return out


def _save(path: Path, state: dict[str, torch.Tensor], config: str = PYTORCH_CONFIG) -> Path:
    torch.save({"meta": {"config": config}, "state_dict": state}, path)
    return path


def _model(tiny_config: Callable[..., MaskRCNNConfig], **overrides: int) -> nn.Module:
    return build_model(tiny_config(**overrides), num_classes=4, image_size=(128, 128))


def test_an_mmdetection_checkpoint_loads_whole(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    source = _model(tiny_config)
    file = _save(tmp_path / "mask_rcnn_r50_fpn.pth", _mmdet_state(source))
    target = _model(tiny_config)
    report = load_weights_into(target, file)
    assert not report.missing and not report.unexpected and not report.shape_mismatch
    theirs, ours = source.state_dict(), target.state_dict()
    background = {
        "roi_heads.box_predictor.bbox_pred.weight": 4,
        "roi_heads.box_predictor.bbox_pred.bias": 4,
        "roi_heads.mask_predictor.mask_fcn_logits.weight": 1,
        "roi_heads.mask_predictor.mask_fcn_logits.bias": 1,
    }
    for key, value in ours.items():
        rows = background.get(key)
        if rows is None:
            assert torch.equal(value, theirs[key]), key
        else:
            assert torch.equal(value[rows:], theirs[key][rows:]), key
            assert not value[:rows].any(), key  # a zero background row, never used


def test_detectron2_and_caffe_style_are_refused_naming_the_difference(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    state = _mmdet_state(_model(tiny_config))
    caffe = _save(tmp_path / "caffe.pth", state, config="backbone=dict(style='caffe')")
    with pytest.raises(CheckpointError, match=r"caffe-style ResNet .* strides in the 1x1 conv"):
        load_weights_into(_model(tiny_config), caffe)
    detectron2 = tmp_path / "model_final.pth"
    torch.save(
        {"model": {"backbone.bottom_up.stem.conv1.weight": torch.zeros(64, 3, 7, 7)}}, detectron2
    )
    with pytest.raises(CheckpointError, match=r"detectron2 .*STRIDE_IN_1X1.* BGR 0-255"):
        load_weights_into(_model(tiny_config), detectron2)


def test_other_layers_and_depths_are_refused(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    state = _mmdet_state(_model(tiny_config))
    state["neck.lateral_convs.0.gn.weight"] = torch.ones(256)
    with pytest.raises(
        CheckpointError, match=r"layers this Mask R-CNN does not have .*\.gn\.weight"
    ):
        load_weights_into(_model(tiny_config), _save(tmp_path / "gn.pth", state))
    deeper = _mmdet_state(_model(tiny_config, nlayers=18))
    with pytest.raises(CheckpointError, match=r"\[2, 2, 2, 2\] blocks per stage.* \[1, 1, 1, 1\]"):
        load_weights_into(_model(tiny_config), _save(tmp_path / "r18.pth", deeper))
