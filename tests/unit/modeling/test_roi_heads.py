"""TF-style proposal labelling and gt_mask_size mask targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torchvision.models.detection.roi_heads import RoIHeads, fastrcnn_loss
from torchvision.ops import roi_align

from maskops.mask_crops import MASK_ORIGINS, crop_masks
from maskops.modeling import build_model
from maskops.modeling.roi_heads import (
    EMPTY_SLOT,
    RangeMatcher,
    Samples,
    mask_loss,
    project_masks_via_gt_crops,
    sampled_fastrcnn_loss,
)
from maskops.spec.models import MaskRCNNConfig
from maskops.training.host_reads import HostReadCounter
from tests.support.tiny_model import FixedSampler

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


def _proposals_and_targets() -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    generator = torch.Generator().manual_seed(0)

    def boxes(count: int) -> torch.Tensor:
        corner = torch.randint(0, 100, (count, 2), generator=generator).float()
        return torch.cat([corner, corner + 4 + torch.rand((count, 2), generator=generator) * 30], 1)

    gt = [boxes(3), boxes(2), boxes(0)]
    # Proposals near the ground truths (positives) and anywhere (mostly background).
    near = [g.repeat(6, 1) + torch.randn((6 * len(g), 4), generator=generator) * 3 for g in gt]
    proposals = [torch.cat([n, boxes(k)]) for n, k in zip(near, (40, 8, 20), strict=True)]
    labels = [torch.tensor([1, 2, 3]), torch.tensor([2, 2]), torch.zeros(0, dtype=torch.int64)]
    return proposals, [{"boxes": g, "labels": lbl} for g, lbl in zip(gt, labels, strict=True)]


def test_training_samples_and_box_losses_are_torchvisions(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    # bg_thresh_lo > 0 leaves some proposals ignored: the second image's sample (8
    # proposals and 2 ground truths, 16 slots) comes out short of its slots.
    heads = build_model(
        tiny_config(batch_size_per_im=16, bg_thresh_lo=0.05, include_mask=False),
        num_classes=4,
        image_size=(128, 128),
    ).roi_heads.train()
    proposals, targets = _proposals_and_targets()
    gt_boxes = [t["boxes"] for t in targets]
    with_gt = heads.add_gt_proposals(proposals, gt_boxes)
    gt_labels = [t["labels"] for t in targets]
    matches = heads.assign_targets_to_proposals(with_gt, gt_boxes, gt_labels)
    expected = RoIHeads.assign_targets_to_proposals(heads, with_gt, gt_boxes, gt_labels)
    for got, reference in zip(matches[0] + matches[1], expected[0] + expected[1], strict=True):
        assert torch.equal(got, reference)

    torch.manual_seed(1)
    heads.fg_bg_sampler = FixedSampler(heads.fg_bg_sampler(matches[1]), 16)
    ours = heads.select_training_samples(proposals, targets)
    theirs = RoIHeads.select_training_samples(heads, proposals, targets)
    filled = [int((labels != EMPTY_SLOT).sum()) for labels in ours[2]]
    assert filled[1] < ours[2][1].shape[0] == 16  # an image with empty slots
    for part, reference in zip(ours, theirs, strict=True):
        for image, (got, expected_rows) in enumerate(zip(part, reference, strict=True)):
            assert torch.equal(got[: filled[image]], expected_rows)

    # Scores and deltas made from each proposal, so both sides see the same for a proposal.
    layer = torch.nn.Linear(4, 4 + 16)

    def loss(rows: tuple[list[torch.Tensor], ...], fn: Callable[..., Any]) -> torch.Tensor:
        out = layer(torch.cat(rows[0]) / 100)
        return torch.stack(fn(out[:, :4], out[:, 4:], *rows[2:]))

    got = loss(ours, lambda c, b, lbl, t: sampled_fastrcnn_loss(c, b, torch.cat(lbl), torch.cat(t)))
    expected_loss = loss(theirs, fastrcnn_loss)
    torch.testing.assert_close(got, expected_loss, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("compact", [False, True])
def test_the_batchs_mask_loss_is_each_images_targets_together(
    tiny_config: Callable[..., MaskRCNNConfig], compact: bool
) -> None:
    """One set of mask targets for the batch (ground truths of every image, one of them
    none, compact crops of different sizes) gives each image's own targets."""
    model = build_model(tiny_config(include_mask=True), num_classes=4, image_size=(128, 128))
    heads = model.roi_heads.train()
    generator = torch.Generator().manual_seed(5)
    targets = []
    for count in (3, 0, 2):
        corner = torch.rand((count, 2), generator=generator) * 80
        boxes = torch.cat(
            [corner, corner + 8 + torch.rand((count, 2), generator=generator) * 40], 1
        )
        masks = (torch.rand((count, 128, 128), generator=generator) > 0.4).to(torch.uint8)
        target = {"boxes": boxes, "labels": torch.randint(1, 4, (count,), generator=generator)}
        if compact:
            target["masks"], target[MASK_ORIGINS] = crop_masks(masks, boxes)
        else:
            target["masks"] = masks
        targets.append(target)
    slots = 6
    proposals = torch.rand((3, slots, 2), generator=generator) * 60
    proposals = torch.cat([proposals, proposals + 20], dim=2)
    labels = torch.tensor(
        [[1, 0, 3, 2, EMPTY_SLOT, 1], [0, 0, 0, EMPTY_SLOT, 0, 0], [2, 2, 0, 0, 0, 1]]
    )
    matched = torch.tensor([[0, 1, 2, 1, 0, 2], [0] * 6, [1, 0, 0, 1, 0, 1]])
    samples = Samples(
        proposals=proposals,
        matched=matched,
        labels=labels,
        regression_targets=torch.zeros((3, slots, 4)),
        gt_counts=torch.tensor([3, 0, 2]),
    )
    features = model.backbone(torch.rand((3, 3, 128, 128), generator=generator))
    shapes = [(128, 128)] * 3
    with torch.no_grad():
        got = heads._mask_loss(features, shapes, samples, targets)
        positives = [row > 0 for row in labels]
        logits = heads._mask_logits(
            features, [p[pos] for p, pos in zip(proposals, positives, strict=True)], shapes
        )
        expected_targets = [
            project_masks_via_gt_crops(
                t["masks"],
                t["boxes"],
                p[pos],
                m[pos],
                gt_mask_size=heads.gt_mask_size,
                resolution=logits.shape[-1],
                mask_origins=t.get(MASK_ORIGINS),
            )
            for t, p, m, pos in zip(targets, proposals, matched, positives, strict=True)
        ]
        expected_labels = [
            t["labels"][m[pos]] for t, m, pos in zip(targets, matched, positives, strict=True)
        ]
        expected = mask_loss(logits, torch.cat(expected_targets), torch.cat(expected_labels))
    assert got.item() > 0
    assert torch.equal(got, expected)


def _box_head_outputs(
    device: str,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[tuple[int, int]]]:
    """Class logits and deltas for two images' proposals, some of them tiny boxes."""
    generator = torch.Generator().manual_seed(3)
    proposals = []
    for count in (60, 40):
        corner = torch.randint(0, 100, (count, 2), generator=generator).float()
        size = torch.rand((count, 2), generator=generator) * 40
        size[:5] = 0.001  # boxes too small to keep
        proposals.append(torch.cat([corner, corner + size], 1).to(device))
    logits = (torch.randn((100, 4), generator=generator) * 3).to(device)
    deltas = (torch.randn((100, 16), generator=generator) * 0.2).to(device)
    return logits, deltas, proposals, [(128, 128), (96, 112)]


def test_detections_with_few_reads_are_torchvisions(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    heads = build_model(tiny_config(), num_classes=4, image_size=(128, 128)).roi_heads.eval()
    outputs = _box_head_outputs("cpu")
    with HostReadCounter() as reads:
        got = heads.detections_with_few_reads(*outputs)
    expected = RoIHeads.postprocess_detections(heads, *outputs)
    assert [len(b) for b in got[0]] == [len(b) for b in expected[0]]
    assert all(len(b) > 0 for b in got[0])
    for part, reference in zip(got, expected, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(part, reference, strict=True))
    # One read of the counts for both images, then an NMS per image.
    assert reads.by_call == {"Tensor.tolist": 1, "torchvision.nms.default": 2}


@pytest.mark.gpu
def test_detections_on_a_gpu_are_torchvisions(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    model = build_model(tiny_config(), num_classes=4, image_size=(128, 128))
    heads = model.roi_heads.eval().cuda()
    outputs = _box_head_outputs("cuda")
    got = heads.postprocess_detections(*outputs)
    expected = RoIHeads.postprocess_detections(heads, *outputs)
    for part, reference in zip(got, expected, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(part, reference, strict=True))
