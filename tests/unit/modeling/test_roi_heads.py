"""TF-style proposal labelling and gt_mask_size mask targets."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import roi_align

from maskops.modeling.roi_heads import RangeMatcher, mask_loss, project_masks_via_gt_crops

FG, BG, IGNORE = None, RangeMatcher.BELOW_LOW_THRESHOLD, RangeMatcher.BETWEEN_THRESHOLDS


def test_range_matcher_three_way_labelling() -> None:
    matcher = RangeMatcher(fg_thresh=0.5, bg_thresh_hi=0.4, bg_thresh_lo=0.1)
    # Two GT boxes x six proposals; the best IoU per proposal decides.
    iou = torch.tensor(
        [
            [0.05, 0.10, 0.39, 0.40, 0.45, 0.90],
            [0.00, 0.00, 0.20, 0.10, 0.30, 0.95],
        ]
    )
    out = matcher(iou).tolist()
    # < lo: ignored; [lo, hi): background; [hi, fg): ignored; >= fg: index of the best GT.
    assert out == [IGNORE, BG, BG, IGNORE, IGNORE, 1]


def test_range_matcher_with_tao_defaults_is_torchvision_like() -> None:
    matcher = RangeMatcher(fg_thresh=0.5, bg_thresh_hi=0.5, bg_thresh_lo=0.0)
    iou = torch.tensor([[0.0, 0.49, 0.5, 0.7]])
    assert matcher(iou).tolist() == [BG, BG, 0, 0]


def test_range_matcher_foreground_wins_overlapping_ranges() -> None:
    matcher = RangeMatcher(fg_thresh=0.5, bg_thresh_hi=0.6, bg_thresh_lo=0.0)
    assert matcher(torch.tensor([[0.55, 0.45]])).tolist() == [0, BG]
    with pytest.raises(ValueError, match="bg_thresh_lo"):
        RangeMatcher(fg_thresh=0.5, bg_thresh_hi=0.2, bg_thresh_lo=0.3)


def _square_masks() -> tuple[torch.Tensor, torch.Tensor]:
    masks = torch.zeros((2, 96, 96), dtype=torch.uint8)
    masks[0, 8:40, 16:48] = 1  # fills its box exactly
    masks[1, 50:90, 40:90] = 1
    masks[1, 50:70, 40:65] = 0  # an L shape: the top-left quarter is empty
    boxes = torch.tensor([[16.0, 8.0, 48.0, 40.0], [40.0, 50.0, 90.0, 90.0]])
    return masks, boxes


def test_targets_match_direct_projection_for_a_fine_crop() -> None:
    masks, gt_boxes = _square_masks()
    proposals = torch.tensor(
        [[16.0, 8.0, 48.0, 40.0], [40.0, 50.0, 90.0, 90.0], [50.0, 60, 80, 85]]
    )
    matched = torch.tensor([0, 1, 1])
    ours = project_masks_via_gt_crops(
        masks, gt_boxes, proposals, matched, gt_mask_size=256, resolution=28
    )
    rois = torch.cat([matched[:, None].float(), proposals], dim=1)
    direct = roi_align(masks[:, None].float(), rois, (28, 28), 1.0, -1, True)[:, 0]
    assert ours.shape == (3, 28, 28)
    # Two bilinear resamplings instead of one: equal up to edge interpolation.
    torch.testing.assert_close(ours, direct, atol=0.07, rtol=0)
    assert (ours - direct).abs().mean() < 0.005


def test_an_unmatched_gt_changes_no_target() -> None:
    """Every GT is cropped, matched or not: the targets of the matched ones are those
    computed from the matched GTs alone, bit for bit."""
    masks, gt_boxes = _square_masks()
    proposals = torch.tensor([[40.0, 50.0, 90.0, 90.0], [45.0, 48, 80, 92]])
    with_unmatched = project_masks_via_gt_crops(
        masks, gt_boxes, proposals, torch.tensor([1, 1]), gt_mask_size=56, resolution=28
    )
    matched_alone = project_masks_via_gt_crops(
        masks[1:], gt_boxes[1:], proposals, torch.tensor([0, 0]), gt_mask_size=56, resolution=28
    )
    torch.testing.assert_close(with_unmatched, matched_alone, rtol=0, atol=0)
    assert with_unmatched.max() == 1.0


def test_targets_are_zero_outside_the_gt_box() -> None:
    masks, gt_boxes = _square_masks()
    # A proposal twice the size of GT 0, centred on it: the GT box is the middle half.
    proposal = torch.tensor([[0.0, -8.0, 64.0, 56.0]])
    target = project_masks_via_gt_crops(
        masks, gt_boxes, proposal, torch.tensor([0]), gt_mask_size=112, resolution=28
    )[0]
    # Bilinear sampling of a binary mask softens its border bins only.
    assert target[8:20, 8:20].min() > 0.99
    assert target[7:21, 7:21].min() > 0.5
    outside = torch.ones_like(target, dtype=torch.bool)
    outside[6:22, 6:22] = False
    assert target[outside].max() == 0.0


def test_gt_mask_size_controls_target_detail() -> None:
    masks, gt_boxes = _square_masks()
    proposal = gt_boxes[1:]
    coarse = project_masks_via_gt_crops(
        masks, gt_boxes, proposal, torch.tensor([1]), gt_mask_size=2, resolution=28
    )[0]
    fine = project_masks_via_gt_crops(
        masks, gt_boxes, proposal, torch.tensor([1]), gt_mask_size=112, resolution=28
    )[0]
    # At 112 the L shape's empty quarter is sharp; at 2x2 it blurs into its neighbours.
    assert fine[:12, :12].max() < 0.01
    assert fine[16:27, 16:27].min() > 0.99
    assert coarse[:12, :12].max() > 0.2
    assert not torch.allclose(coarse, fine, atol=0.1)


def test_no_positive_proposals_gives_empty_targets_and_zero_loss() -> None:
    masks, gt_boxes = _square_masks()
    empty = project_masks_via_gt_crops(
        masks,
        gt_boxes,
        torch.zeros((0, 4)),
        torch.zeros((0,), dtype=torch.int64),
        gt_mask_size=56,
        resolution=28,
    )
    assert empty.shape == (0, 28, 28)
    logits = torch.zeros((0, 3, 28, 28), requires_grad=True)
    loss = mask_loss(logits, empty, torch.zeros((0,), dtype=torch.int64))
    assert loss.item() == 0.0
    loss.backward()


def test_mask_loss_uses_the_logits_of_each_rois_class() -> None:
    targets = torch.ones((2, 4, 4))
    logits = torch.zeros((2, 3, 4, 4))
    logits[0, 2] = 20.0  # RoI 0 (class 2) is confidently right
    logits[1, 1] = 20.0  # RoI 1 (class 2) has class 1 right, which must not count
    loss = mask_loss(logits, targets, torch.tensor([2, 2]))
    expected = (
        torch.nn.functional.softplus(torch.tensor(-20.0)) + torch.log(torch.tensor(2.0))
    ) / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
