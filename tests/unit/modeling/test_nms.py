"""NMS within groups: one call on a GPU keeps what torchvision's per-group loop keeps."""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import batched_nms

from maskops.modeling.nms import nms_by_group, nms_in_one_call, nms_kept_mask


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
