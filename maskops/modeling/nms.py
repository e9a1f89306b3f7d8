"""Non-maximum suppression within groups (FPN levels, classes), reading the device once.

torchvision's ``batched_nms`` loops over the groups of a large input (past 5,000 boxes on
a GPU, 1,000 on a CPU), and each turn of its loop reads the device: a ``torch.unique``,
then a ``torch.where`` and an NMS per group. On a GPU, :func:`nms_by_group` runs one NMS
call whatever the size, with torchvision's own coordinate trick; on a CPU, where reads
cost nothing and the loop is the faster way, it is torchvision's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import boxes as box_ops


def nms_by_group(boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float) -> Tensor:
    """torchvision's ``batched_nms``: the indices kept, by decreasing score.

    Args:
        boxes: ``[K, 4]`` xyxy.
        scores: ``[K]``.
        groups: ``[K]`` int64 >= 0; boxes of different groups never suppress each other.
        iou_threshold: boxes overlapping a better one of their group by more than this go.
    """
    if boxes.device.type == "cpu":
        return box_ops.batched_nms(boxes, scores, groups, iou_threshold)
    return nms_in_one_call(boxes, scores, groups, iou_threshold)


def nms_in_one_call(boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float) -> Tensor:
    """``batched_nms`` as one NMS call: every group's boxes shifted clear of the others'
    (torchvision's coordinate trick, the same offsets), so no two groups overlap."""
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    offsets = groups.to(boxes) * (boxes.max() + 1)
    return box_ops.nms(boxes + offsets[:, None], scores, iou_threshold)


def nms_kept_mask(
    boxes: Tensor, scores: Tensor, groups: Tensor, usable: Tensor, iou_threshold: float
) -> Tensor:
    """NMS within each group over the usable boxes, as a mask: ``[K]`` bool, True if kept.

    Args:
        boxes: ``[K, 4]`` xyxy.
        scores: ``[K]``.
        groups: ``[K]`` int64 >= 0.
        usable: ``[K]`` bool; the others are not kept and suppress nothing.
        iou_threshold: as :func:`nms_by_group`'s.
    """
    # The unusable boxes go to a group of their own rather than out of the input, which
    # would need a read of how many remain.
    groups = torch.where(usable, groups, groups.max() + 1)
    keep = nms_by_group(boxes, scores, groups, iou_threshold)
    return torch.zeros_like(usable).index_fill_(0, keep, True) & usable
