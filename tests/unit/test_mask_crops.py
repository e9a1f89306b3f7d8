"""Compact masks: the mask head's targets and loss from box crops equal the full frame's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maskops.data.pipeline import DecodeOptions, ShardDataset
from maskops.mask_crops import MASK_ORIGINS, crop_masks, crop_windows
from maskops.modeling.roi_heads import mask_loss, project_masks_via_gt_crops

FRAME = (48, 64)


def _random_instances(generator: torch.Generator, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` noisy full-frame masks (pixels outside their boxes too) and float boxes
    inside the frame, some reaching its edges or half a pixel beyond them."""
    height, width = FRAME
    masks = (torch.rand((count, height, width), generator=generator) > 0.5).to(torch.uint8)
    low = torch.rand((count, 2), generator=generator) * torch.tensor([width - 4.0, height - 4.0])
    size = 1.5 + torch.rand((count, 2), generator=generator) * torch.tensor([width, height]) / 2
    high = torch.minimum(low + size, torch.tensor([width + 0.5, height + 0.5]))
    boxes = torch.cat([low, high], dim=1)
    boxes[0] = torch.tensor([0.0, 0.0, width, height])  # the whole frame
    boxes[1] = torch.tensor([width - 7.3, height - 5.6, width + 0.5, height + 0.5])
    boxes[2] = torch.tensor([0.2, 3.0, 9.5, height])  # left edge and bottom
    return masks, boxes


def _proposals(generator: torch.Generator, gt_boxes: torch.Tensor, per_gt: int) -> torch.Tensor:
    """Boxes around each gt box, many of them reaching beyond it (and beyond the frame)."""
    centre = (gt_boxes[:, :2] + gt_boxes[:, 2:]) / 2
    half = (gt_boxes[:, 2:] - gt_boxes[:, :2]) / 2
    centre = centre.repeat_interleave(per_gt, dim=0)
    half = half.repeat_interleave(per_gt, dim=0)
    shift = (torch.rand(centre.shape, generator=generator) - 0.5) * half
    scale = 0.4 + 1.2 * torch.rand(half.shape, generator=generator)
    return torch.cat([centre + shift - half * scale, centre + shift + half * scale], dim=1)


@pytest.mark.parametrize(("gt_mask_size", "resolution"), [(112, 28), (28, 14), (7, 28)])
def test_targets_and_loss_from_crops_equal_the_full_frames(
    gt_mask_size: int, resolution: int
) -> None:
    generator = torch.Generator().manual_seed(gt_mask_size)
    masks, gt_boxes = _random_instances(generator, count=12)
    proposals = _proposals(generator, gt_boxes, per_gt=6)
    matched = torch.arange(12).repeat_interleave(6)
    crops, origins = crop_masks(masks, gt_boxes)
    assert crops.shape[1] < FRAME[0] + 2 and crops.dtype == torch.uint8

    def targets(gt: torch.Tensor, mask_origins: torch.Tensor | None) -> torch.Tensor:
        return project_masks_via_gt_crops(
            gt,
            gt_boxes,
            proposals,
            matched,
            gt_mask_size=gt_mask_size,
            resolution=resolution,
            mask_origins=mask_origins,
        )

    full, compact = targets(masks, None), targets(crops, origins)
    assert full.abs().sum() > 0 and (full < 1).any()  # soft, non-trivial targets
    torch.testing.assert_close(compact, full, atol=1e-5, rtol=0)
    labels = torch.randint(1, 4, (len(proposals),), generator=generator)
    logits = torch.randn((len(proposals), 4, resolution, resolution), generator=generator)
    torch.testing.assert_close(
        mask_loss(logits, compact, labels), mask_loss(logits, full, labels), atol=1e-6, rtol=0
    )


def test_windows_hold_each_box_with_a_pixel_to_spare_within_the_frame() -> None:
    boxes = torch.tensor([[10.2, 5.0, 20.7, 9.5], [0.3, 0.0, 64.0, 48.0], [60.0, 40.0, 64.5, 48.5]])
    assert crop_windows(boxes, FRAME).tolist() == [
        [9, 4, 22, 11],
        [0, 0, 64, 48],
        [59, 39, 64, 48],
    ]


def test_a_crop_at_the_frame_edge_repeats_its_last_column_and_row() -> None:
    masks = torch.zeros((2, *FRAME), dtype=torch.uint8)
    masks[0, 44:, 60:] = 1  # in the bottom right corner
    masks[1, 10:20, 10:20] = 1
    boxes = torch.tensor([[60.0, 44.0, 64.0, 48.0], [10.0, 10.0, 20.0, 20.0]])
    crops, origins = crop_masks(masks, boxes)
    assert origins.tolist() == [[59.0, 43.0], [9.0, 9.0]]
    assert crops.shape == (2, 13, 13)  # the larger window (12 x 12) and the repeat
    assert crops[0, :5, :5].tolist() == [[0] * 5] + [[0, 1, 1, 1, 1]] * 4
    assert crops[0, :6, 5].tolist() == [0, 1, 1, 1, 1, 1]  # the last column, repeated
    assert crops[0, 5, :6].tolist() == [0, 1, 1, 1, 1, 1]  # and the last row
    assert crops[0, 6:].sum() == 0 and crops[0, :, 6:].sum() == 0
    assert crops[1, :12, :12].sum() == 100 and crops[1].sum() == 100  # inside: no repeat


@pytest.mark.parametrize("flip", [False, True])
def test_the_loader_crops_its_masks_as_the_full_frames_crop(demo_shards: Path, flip: bool) -> None:
    pattern = f"{demo_shards}/train*"
    full = ShardDataset(pattern, DecodeOptions(image_size=(96, 128)))
    compact = ShardDataset(pattern, DecodeOptions(image_size=(96, 128), compact_masks=True))
    full_bytes = compact_bytes = 0
    for index in range(6):
        image, target = full.load(index, flip=flip)
        image_c, target_c = compact.load(index, flip=flip)
        assert torch.equal(image, image_c) and torch.equal(target["boxes"], target_c["boxes"])
        crops, origins = crop_masks(target["masks"], target["boxes"])
        assert torch.equal(target_c["masks"], crops)
        assert torch.equal(target_c[MASK_ORIGINS], origins)
        full_bytes += target["masks"].numel()
        compact_bytes += target_c["masks"].numel()
    print(f"mask bytes: full frames {full_bytes}, cropped {compact_bytes}")
    assert compact_bytes < full_bytes / 2
