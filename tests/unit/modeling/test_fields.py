"""Every MaskRCNNConfig field changes the built model (table-driven).

Each row sets one field to a non-default value and checks the part of the model that field
drives; a row also checks that the default model differs there, so a field that is parsed
and ignored fails. The last test makes the table cover every field of the config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torchvision.ops.misc import FrozenBatchNorm2d

from maskops.modeling import SpecMaskRCNN, build_model
from maskops.spec.models import MaskRCNNConfig

Probe = Callable[[SpecMaskRCNN], Any]


def _anchor_sizes(m: SpecMaskRCNN) -> list[list[float]]:
    cells = m.rpn.anchor_generator.cell_anchors
    return [torch.round((c[:, 2:] - c[:, :2]) * 1000).flatten().tolist() for c in cells]


def _nms(m: SpecMaskRCNN, training: bool) -> float:
    m.rpn.train(training)
    return float(m.rpn.nms_thresh)


def _mask_resolution(m: SpecMaskRCNN) -> tuple[int, int]:
    pool_size = m.roi_heads.mask_roi_pool.output_size
    with torch.no_grad():
        feats = torch.zeros(1, 256, *pool_size)
        logits = m.roi_heads.mask_predictor(m.roi_heads.mask_head(feats))
    return tuple(logits.shape[-2:])


FIELD_TABLE: list[tuple[str, Any, Probe]] = [
    ("nlayers", 18, lambda m: len(m.backbone.body.layer1)),
    ("freeze_bn", True, lambda m: isinstance(m.backbone.body.bn1, FrozenBatchNorm2d)),
    (
        "freeze_blocks",
        [0, 2],
        lambda m: sorted(
            {n.split(".")[0] for n, p in m.backbone.body.named_parameters() if not p.requires_grad}
        ),
    ),
    ("gt_mask_size", 56, lambda m: m.roi_heads.gt_mask_size),
    ("rpn_positive_overlap", 0.6, lambda m: m.rpn.proposal_matcher.high_threshold),
    ("rpn_negative_overlap", 0.2, lambda m: m.rpn.proposal_matcher.low_threshold),
    ("rpn_batch_size_per_im", 128, lambda m: m.rpn.fg_bg_sampler.batch_size_per_image),
    ("rpn_fg_fraction", 0.3, lambda m: m.rpn.fg_bg_sampler.positive_fraction),
    ("rpn_min_size", 4.0, lambda m: m.rpn.min_size),
    ("batch_size_per_im", 16, lambda m: m.roi_heads.fg_bg_sampler.batch_size_per_image),
    ("fg_fraction", 0.5, lambda m: m.roi_heads.fg_bg_sampler.positive_fraction),
    ("fg_thresh", 0.6, lambda m: m.roi_heads.proposal_matcher.high_threshold),
    ("bg_thresh_hi", 0.4, lambda m: m.roi_heads.proposal_matcher.bg_thresh_hi),
    ("bg_thresh_lo", 0.1, lambda m: m.roi_heads.proposal_matcher.bg_thresh_lo),
    ("fast_rcnn_mlp_head_dim", 32, lambda m: m.roi_heads.box_head.fc7.out_features),
    ("bbox_reg_weights", (1.0, 2.0, 3.0, 4.0), lambda m: tuple(m.roi_heads.box_coder.weights)),
    ("include_mask", False, lambda m: m.roi_heads.has_mask()),
    ("mrcnn_resolution", 16, _mask_resolution),
    ("train_rpn_pre_nms_topn", 300, lambda m: m.rpn._pre_nms_top_n["training"]),
    ("train_rpn_post_nms_topn", 40, lambda m: m.rpn._post_nms_top_n["training"]),
    ("train_rpn_nms_threshold", 0.6, lambda m: _nms(m, training=True)),
    ("test_detections_per_image", 9, lambda m: m.roi_heads.detections_per_img),
    ("test_nms", 0.3, lambda m: m.roi_heads.nms_thresh),
    ("test_rpn_pre_nms_topn", 300, lambda m: m.rpn._pre_nms_top_n["testing"]),
    ("test_rpn_post_nms_topn", 40, lambda m: m.rpn._post_nms_top_n["testing"]),
    ("test_rpn_nms_thresh", 0.6, lambda m: _nms(m, training=False)),
    ("min_level", 3, lambda m: list(m.backbone(torch.zeros(1, 3, 128, 128)))),
    ("max_level", 7, lambda m: list(m.backbone(torch.zeros(1, 3, 128, 128)))),
    ("num_scales", 2, lambda m: m.rpn.head.cls_logits.out_channels),
    ("aspect_ratios", [(1.0, 1.0), (2.0, 0.5)], _anchor_sizes),
    ("anchor_scale", 4.0, _anchor_sizes),
    ("rpn_box_loss_weight", 2.0, lambda m: m.loss_weights["loss_rpn_box_reg"]),
    ("fast_rcnn_box_loss_weight", 2.0, lambda m: m.loss_weights["loss_box_reg"]),
    ("mrcnn_weight_loss_mask", 2.0, lambda m: m.loss_weights["loss_mask"]),
]

EXPECTED: dict[str, Any] = {
    "nlayers": 2,
    "freeze_bn": True,
    "freeze_blocks": ["conv1", "layer2"],
    "gt_mask_size": 56,
    "rpn_positive_overlap": 0.6,
    "rpn_negative_overlap": 0.2,
    "rpn_batch_size_per_im": 128,
    "rpn_fg_fraction": 0.3,
    "rpn_min_size": 4.0,
    "batch_size_per_im": 16,
    "fg_fraction": 0.5,
    "fg_thresh": 0.6,
    "bg_thresh_hi": 0.4,
    "bg_thresh_lo": 0.1,
    "fast_rcnn_mlp_head_dim": 32,
    "bbox_reg_weights": (1.0, 2.0, 3.0, 4.0),
    "include_mask": False,
    "mrcnn_resolution": (16, 16),
    "train_rpn_pre_nms_topn": 300,
    "train_rpn_post_nms_topn": 40,
    "train_rpn_nms_threshold": 0.6,
    "test_detections_per_image": 9,
    "test_nms": 0.3,
    "test_rpn_pre_nms_topn": 300,
    "test_rpn_post_nms_topn": 40,
    "test_rpn_nms_thresh": 0.6,
    "min_level": ["p3", "p4", "p5", "p6"],
    "max_level": ["p2", "p3", "p4", "p5", "p6", "p7"],
    "num_scales": 2 * 3,
    "aspect_ratios": [
        [32000.0, 32000.0, 64000.0, 16000.0],
        [64000.0, 64000.0, 128000.0, 32000.0],
        [128000.0, 128000.0, 256000.0, 64000.0],
        [256000.0, 256000.0, 512000.0, 128000.0],
        [512000.0, 512000.0, 1024000.0, 256000.0],
    ],
    "anchor_scale": [
        [16000.0, 16000.0, 22400.0, 11200.0, 11200.0, 22400.0],
        [32000.0, 32000.0, 44800.0, 22400.0, 22400.0, 44800.0],
        [64000.0, 64000.0, 89600.0, 44800.0, 44800.0, 89600.0],
        [128000.0, 128000.0, 179200.0, 89600.0, 89600.0, 179200.0],
        [256000.0, 256000.0, 358400.0, 179200.0, 179200.0, 358400.0],
    ],
    "rpn_box_loss_weight": 2.0,
    "fast_rcnn_box_loss_weight": 2.0,
    "mrcnn_weight_loss_mask": 2.0,
}

# Fields whose effect is not a model attribute: "arch" selects the backbone family and
# only "resnet" exists, so a different value must be refused.
REJECTED: dict[str, Any] = {"arch": "vgg"}

BASE = {"nlayers": 10, "fast_rcnn_mlp_head_dim": 64}
IMAGE_SIZE = (128, 128)


def _build(**fields: Any) -> SpecMaskRCNN:
    config = MaskRCNNConfig(**{**BASE, **fields})
    return build_model(config, num_classes=3, image_size=IMAGE_SIZE)


@pytest.fixture(scope="module")
def default_model() -> SpecMaskRCNN:
    return _build()


@pytest.mark.parametrize(("field", "value", "probe"), FIELD_TABLE, ids=[r[0] for r in FIELD_TABLE])
def test_field_changes_the_model(
    field: str, value: Any, probe: Probe, default_model: SpecMaskRCNN
) -> None:
    model = _build(**{field: value})
    with torch.no_grad():
        got, default = probe(model), probe(default_model)
    assert got == EXPECTED[field]
    assert got != default, f"{field}={value!r} builds the same model as the default"


@pytest.mark.parametrize(("field", "value"), REJECTED.items())
def test_unsupported_values_are_refused(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        _build(**{field: value})


def test_table_covers_every_config_field() -> None:
    covered = {row[0] for row in FIELD_TABLE} | set(REJECTED)
    assert covered == set(MaskRCNNConfig.model_fields)
    assert set(EXPECTED) == {row[0] for row in FIELD_TABLE}
