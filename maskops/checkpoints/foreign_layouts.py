"""COCO checkpoints of other frameworks in this model's (torchvision's) layer names.

- **mmdetection** (``mask_rcnn_r50_fpn`` and the like, ``pytorch``-style ResNet): the
  backbone, FPN (``neck``), RPN and RoI heads are renamed; the class rows move from
  background-last to torchvision's background-first (``fc_cls``), and the class-specific
  box and mask outputs, which have no background row, get a zero one. A ``caffe``-style
  backbone (its meta config says so) is refused: it strides in each stage's first 1x1
  conv and reads BGR 0-255 input.
- **detectron2**: refused, naming the difference: its ResNets stride in the 1x1 conv
  (``MODEL.RESNETS.STRIDE_IN_1X1``, True in its model zoo) and its weights take BGR 0-255
  input, where this model's torchvision ResNet strides in the 3x3 conv and reads RGB
  normalised by ImageNet statistics; the layer shapes match, the computation would not.

Any layer of the file that has no counterpart here (GroupNorm, other heads) is refused by
name rather than silently dropped. Input: the file's tensors and its raw object (for
mmdetection's ``meta``); output: tensors under this model's names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
from torch import Tensor

from maskops.checkpoints.model_file import CheckpointError

Rename = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def _rule(pattern: str, template: str, **offsets: int) -> Rename:
    """``template`` formatted with the groups (``g1``...); ``offsets`` shift numeric ones."""

    def rename(match: re.Match[str]) -> str:
        groups = {f"g{i}": g for i, g in enumerate(match.groups(), start=1)}
        for name, offset in offsets.items():
            groups[name] = str(int(groups[name]) + offset)
        return template.format(**groups)

    return re.compile(pattern), rename


MMDET_RULES: tuple[Rename, ...] = (
    _rule(r"^backbone\.(conv1\.weight|bn1\..+)$", "backbone.body.{g1}"),
    _rule(
        r"^backbone\.(layer\d\.\d+\.(?:conv\d\.weight|bn\d\..+|downsample\.[01]\..+))$",
        "backbone.body.{g1}",
    ),
    _rule(
        r"^neck\.lateral_convs\.(\d)\.conv\.(weight|bias)$", "backbone.fpn.inner_blocks.{g1}.0.{g2}"
    ),
    _rule(r"^neck\.fpn_convs\.(\d)\.conv\.(weight|bias)$", "backbone.fpn.layer_blocks.{g1}.0.{g2}"),
    _rule(r"^rpn_head\.rpn_conv\.(weight|bias)$", "rpn.head.conv.0.0.{g1}"),
    _rule(r"^rpn_head\.rpn_cls\.(weight|bias)$", "rpn.head.cls_logits.{g1}"),
    _rule(r"^rpn_head\.rpn_reg\.(weight|bias)$", "rpn.head.bbox_pred.{g1}"),
    _rule(
        r"^roi_head\.bbox_head\.shared_fcs\.(\d)\.(weight|bias)$",
        "roi_heads.box_head.fc{g1}.{g2}",
        g1=6,
    ),
    _rule(
        r"^roi_head\.bbox_head\.fc_cls\.(weight|bias)$", "roi_heads.box_predictor.cls_score.{g1}"
    ),
    _rule(
        r"^roi_head\.bbox_head\.fc_reg\.(weight|bias)$", "roi_heads.box_predictor.bbox_pred.{g1}"
    ),
    _rule(
        r"^roi_head\.mask_head\.convs\.(\d)\.conv\.(weight|bias)$",
        "roi_heads.mask_head.{g1}.0.{g2}",
    ),
    _rule(
        r"^roi_head\.mask_head\.upsample\.(weight|bias)$",
        "roi_heads.mask_predictor.conv5_mask.{g1}",
    ),
    _rule(
        r"^roi_head\.mask_head\.conv_logits\.(weight|bias)$",
        "roi_heads.mask_predictor.mask_fcn_logits.{g1}",
    ),
)

CLS_SCORE = "roi_heads.box_predictor.cls_score."
BOX_DELTAS = "roi_heads.box_predictor.bbox_pred."
MASK_LOGITS = "roi_heads.mask_predictor.mask_fcn_logits."

DETECTRON2_DIFFERENCE = (
    "a detectron2 checkpoint: its ResNet strides in the 1x1 conv of each stage's first block "
    "(MODEL.RESNETS.STRIDE_IN_1X1, True in its model zoo) and its weights take BGR 0-255 "
    "input, where this model's torchvision ResNet strides in the 3x3 conv and reads RGB "
    "normalised by ImageNet statistics: the layer names could be mapped, the computation "
    "would differ; start from MaskRCNN_ResNet50_FPN_Weights.COCO_V1 or an mmdetection "
    "pytorch-style checkpoint instead"
)


def framework_of(keys: Mapping[str, Any]) -> str | None:
    """``"mmdetection"``, ``"detectron2"``, or None (torchvision's names, or another)."""
    if any(k.startswith(("backbone.bottom_up.", "proposal_generator.")) for k in keys):
        return "detectron2"
    if any(k.startswith(("neck.", "rpn_head.", "roi_head.")) for k in keys):
        return "mmdetection"
    return None


def from_framework(
    tensors: dict[str, Tensor], raw: Any, file: object, model_keys: Collection[str]
) -> dict[str, Tensor]:
    """``tensors`` under this model's names (unchanged when torchvision's already);
    ``raw`` is what the file held, ``model_keys`` the model's state-dict keys."""
    framework = framework_of(tensors)
    if framework is None:
        return tensors
    if framework == "detectron2":
        raise CheckpointError(f"{file}: {DETECTRON2_DIFFERENCE}")
    config = str((raw.get("meta") or {}).get("config", "")) if isinstance(raw, dict) else ""
    if re.search(r"""style\s*[=:]\s*['"]caffe['"]""", config):
        raise CheckpointError(
            f"{file}: an mmdetection checkpoint with a caffe-style ResNet (its meta config): it "
            "strides in the 1x1 conv of each stage's first block and takes BGR 0-255 input, "
            "where this model's torchvision ResNet strides in the 3x3 conv and reads RGB "
            "normalised by ImageNet statistics; use a pytorch-style checkpoint"
        )
    renamed, unmapped = _rename(tensors, MMDET_RULES)
    if unmapped:
        shown = ", ".join(unmapped[:8]) + (
            f" and {len(unmapped) - 8} more" if len(unmapped) > 8 else ""
        )
        raise CheckpointError(
            f"{file}: an mmdetection checkpoint with layers this Mask R-CNN does not have "
            f"(another architecture: e.g. GroupNorm, other heads): {shown}"
        )
    theirs, ours = _stage_blocks(renamed), _stage_blocks(model_keys)
    if theirs != ours:
        raise CheckpointError(
            f"{file}: an mmdetection checkpoint whose ResNet has {theirs} blocks per stage, "
            f"where the spec's model has {ours} (maskrcnn_config.nlayers: 50 is [3, 4, 6, 3], "
            "101 is [3, 4, 23, 3])"
        )
    return _background_first(renamed)


_BLOCK = re.compile(r"^backbone\.body\.layer(\d)\.(\d+)\.conv1\.weight$")


def _stage_blocks(keys: Collection[str]) -> list[int]:
    """Blocks per ResNet stage of a state dict in this model's names."""
    blocks: dict[int, int] = {}
    for key in keys:
        match = _BLOCK.match(key)
        if match:
            stage, index = int(match.group(1)), int(match.group(2))
            blocks[stage] = max(blocks.get(stage, 0), index + 1)
    return [blocks[stage] for stage in sorted(blocks)]


def _rename(
    tensors: Mapping[str, Tensor], rules: tuple[Rename, ...]
) -> tuple[dict[str, Tensor], list[str]]:
    renamed: dict[str, Tensor] = {}
    unmapped: list[str] = []
    for key, value in tensors.items():
        for pattern, rename in rules:
            match = pattern.match(key)
            if match:
                renamed[rename(match)] = value
                break
        else:
            if not key.endswith("num_batches_tracked"):
                unmapped.append(key)
    return renamed, sorted(unmapped)


def _background_first(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """mmdetection's class outputs in torchvision's order: background row first.

    ``fc_cls`` has C+1 rows, background last: it moves to the front. The class-specific
    box deltas (4C rows) and mask logits (C rows) have no background row: a zero one is
    put first (torchvision never uses it). Class-agnostic deltas (4 rows) stay.
    """
    out = dict(tensors)
    for suffix in ("weight", "bias"):
        scores = out.get(CLS_SCORE + suffix)
        if scores is None:
            continue
        classes = scores.shape[0] - 1
        out[CLS_SCORE + suffix] = torch.cat([scores[-1:], scores[:-1]])
        deltas = out.get(BOX_DELTAS + suffix)
        if deltas is not None and deltas.shape[0] == 4 * classes and classes > 1:
            out[BOX_DELTAS + suffix] = torch.cat([deltas.new_zeros((4, *deltas.shape[1:])), deltas])
        logits = out.get(MASK_LOGITS + suffix)
        if logits is not None and logits.shape[0] == classes:
            out[MASK_LOGITS + suffix] = torch.cat(
                [logits.new_zeros((1, *logits.shape[1:])), logits]
            )
    return out
