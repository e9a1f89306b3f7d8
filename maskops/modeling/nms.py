"""Non-maximum suppression within groups (FPN levels, classes), reading the device once.

torchvision's ``batched_nms`` loops over the groups of a large input (past 5,000 boxes on
a GPU, 1,000 on a CPU), and each turn of its loop reads the device: a ``torch.unique``,
then a ``torch.where`` and an NMS per group. On a GPU, :func:`nms_by_group` runs one NMS
call whatever the size, with torchvision's own coordinate trick; on a CPU, where reads
cost nothing and the loop is the faster way, it is torchvision's.
:func:`greedy_nms_by_segment` settles many groups side by side instead
(``DeviceTuning.segmented_nms``).
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


def greedy_nms_by_segment(boxes: Tensor, usable: Tensor, iou_threshold: float) -> Tensor:
    """Greedy NMS within each segment, every segment at once: ``[S, L]`` bool, True if kept.

    Args:
        boxes: ``[S, L, 4]`` xyxy, each segment's boxes in the order NMS visits them (by
            decreasing score; ties stay in this order, as torchvision's stable sort keeps
            its input's).
        usable: ``[S, L]`` bool; the others (padding too) are not kept and suppress nothing.
        iou_threshold: a box goes when a kept box before it in its segment overlaps it by
            more than this (IoU computed and compared as torchvision's NMS kernels do).

    Greedy NMS keeps a usable box exactly when no kept box before it overlaps it: a rule
    with one solution, which rounds of "keep what no box kept so far suppresses" reach from
    every usable box kept (after round r the first r boxes of every segment are final, and
    a round that changes nothing has reached the solution). Each round is one pass over the
    ``[S, L, L]`` overlaps and one read of the device; the rounds number the longest chain
    of suppressions, plus one. Unlike one NMS call per image, whose kept boxes one GPU
    thread block gathers box after box, the segments (an image's FPN levels, the images
    of a batch) are settled side by side.
    """
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    x0, y0, x1, y1 = boxes.unbind(-1)
    inter = _pairwise_overlap(x0, x1).mul_(_pairwise_overlap(y0, y1))
    iou = inter / (area[..., :, None] + area[..., None, :] - inter)  # row: the better box
    length = boxes.shape[-2]
    before = torch.ones((length, length), dtype=torch.bool, device=boxes.device).triu_(1)
    # torchvision's kernels compare with the threshold at their own precision: a double on
    # a CPU, a float on CUDA (an IoU that rounds to float32(0.3) suppresses at 0.3 on a
    # CPU only).
    overlaps = iou.double() if boxes.device.type == "cpu" else iou
    suppresses = (overlaps > iou_threshold) & before & usable[..., :, None]
    kept = usable
    for _ in range(length + 1):
        now = usable & ~(suppresses & kept[..., :, None]).any(dim=-2)
        if torch.equal(now, kept):
            break
        kept = now
    return kept


def _pairwise_overlap(low: Tensor, high: Tensor) -> Tensor:
    """``[..., L, L]``: how long the intervals ``[low, high]`` (``[..., L]`` each) of
    every pair overlap, 0 where they do not."""
    ends = torch.minimum(high[..., :, None], high[..., None, :])
    starts = torch.maximum(low[..., :, None], low[..., None, :])
    return (ends - starts).clamp_(min=0)
