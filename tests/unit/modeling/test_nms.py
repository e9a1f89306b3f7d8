"""NMS within groups: one call on a GPU, and the segments settled side by side, keep what
torchvision's per-group loop keeps."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torchvision.ops import batched_nms, nms

from maskops.modeling.nms import (
    greedy_nms_by_segment,
    nms_by_group,
    nms_in_one_call,
    nms_kept_mask,
)


def _integer_boxes(count: int, generator: torch.Generator) -> Tensor:
    """``[count, 4]`` xyxy boxes on the integer grid: the groups' offsets shift them exactly."""
    corner = torch.randint(0, 128, (count, 2), generator=generator).float()
    return torch.cat([corner, corner + torch.randint(1, 60, (count, 2), generator=generator)], 1)


def test_one_nms_call_keeps_what_a_call_per_group_keeps() -> None:
    """The GPU's single NMS call against torchvision's loop over the groups (which it takes
    for this many boxes), both run here on the CPU."""
    generator = torch.Generator().manual_seed(1)
    boxes = _integer_boxes(3000, generator)
    scores = torch.rand(3000, generator=generator)
    groups = torch.randint(0, 5, (3000,), generator=generator)
    one_call = nms_in_one_call(boxes, scores, groups, 0.6)
    assert torch.equal(one_call, batched_nms(boxes, scores, groups, 0.6))
    assert 0 < one_call.shape[0] < 3000

    usable = torch.rand(3000, generator=generator) > 0.2
    kept = nms_kept_mask(boxes, scores, groups, usable, 0.6)
    expected = torch.zeros(3000, dtype=torch.bool)
    expected[
        torch.where(usable)[0][batched_nms(boxes[usable], scores[usable], groups[usable], 0.6)]
    ] = True
    assert torch.equal(kept, expected)


def test_nms_by_group_is_batched_nms_here_and_handles_no_boxes() -> None:
    generator = torch.Generator().manual_seed(2)
    boxes = _integer_boxes(200, generator)
    scores = torch.rand(200, generator=generator)
    groups = torch.randint(0, 3, (200,), generator=generator)
    assert torch.equal(
        nms_by_group(boxes, scores, groups, 0.5), batched_nms(boxes, scores, groups, 0.5)
    )
    assert nms_in_one_call(boxes[:0], scores[:0], groups[:0], 0.5).shape == (0,)


def _segment_keeps(boxes: Tensor, usable: Tensor, threshold: float) -> Tensor:
    """torchvision's NMS of one segment's usable boxes (given by decreasing score), as a mask."""
    length = boxes.shape[0]
    scores = torch.linspace(1.0, 0.0, length, device=boxes.device)  # the order given
    index = torch.where(usable)[0]
    kept = torch.zeros(length, dtype=torch.bool, device=boxes.device)
    kept[index[nms(boxes[index], scores[index], threshold)]] = True
    return kept


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
)  # each against torchvision's kernel for its device
@pytest.mark.parametrize("threshold", [0.3, 0.7])
def test_segments_settled_side_by_side_keep_what_nms_keeps_in_each(
    threshold: float, device: str
) -> None:
    generator = torch.Generator().manual_seed(3)
    segments, length = 6, 300
    corners = torch.rand(segments, length, 2, generator=generator) * 100
    sizes = torch.rand(segments, length, 2, generator=generator) * 40
    boxes = torch.cat([corners, corners + sizes], dim=-1)  # float boxes, some slivers
    boxes[0, 1] = boxes[0, 0]  # an exact duplicate of the first: the later one goes
    usable = torch.rand(segments, length, generator=generator) > 0.1
    usable[1] = False  # a segment of padding alone
    usable[0, :2] = True
    boxes, usable = boxes.to(device), usable.to(device)
    kept = greedy_nms_by_segment(boxes, usable, threshold)
    for segment in range(segments):
        expected = _segment_keeps(boxes[segment], usable[segment], threshold)
        assert torch.equal(kept[segment], expected)
    assert not kept[1].any() and kept[0, 0] and not kept[0, 1]
    assert 0 < kept.sum() < usable.sum()
