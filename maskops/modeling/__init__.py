"""Mask R-CNN built from a maskops spec on torchvision's detection models.

The one entry point is :func:`build_model`; :func:`resize_to_state_dict` reshapes a built
model to a pruned checkpoint's tensor shapes. Checkpoint files are handled in
:mod:`maskops.checkpoints`.
"""

from .anchors import LevelAnchorGenerator, cell_anchors_for_level
from .backbone import FREEZE_BLOCK_MODULES, build_resnet_fpn_backbone
from .model import LOSS_NAMES, PRUNABLE_LAYER_PREFIXES, SpecMaskRCNN, build_model, prunable_convs
from .surgery import resize_to_state_dict

__all__ = [
    "FREEZE_BLOCK_MODULES",
    "LOSS_NAMES",
    "PRUNABLE_LAYER_PREFIXES",
    "LevelAnchorGenerator",
    "SpecMaskRCNN",
    "build_model",
    "build_resnet_fpn_backbone",
    "cell_anchors_for_level",
    "prunable_convs",
    "resize_to_state_dict",
]
