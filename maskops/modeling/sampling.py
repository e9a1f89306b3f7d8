"""Anchor/proposal matching and sampling without a host read: torchvision's rules, in
fixed-shape tensor operations.

torchvision's ``Matcher`` and ``BalancedPositiveNegativeSampler`` pick their elements with
``torch.where(mask)`` and boolean-mask assignments. On a GPU each of those waits for the
device to learn how many elements it picked, several times per image per step, and the
device then idles while the host catches up. The same rules, written with ``torch.where``'s
three-argument form, ``topk`` over random keys and index scatters, give the same matches
and the same law of samples with shapes that never depend on the data.

They take a batch's images at once, each image's boxes padded to the most of any
(:func:`pad_boxes`): a loop over the images would cost the host a few dozen operator calls
per image, which at eight or sixteen images per GPU step outweigh the rest of the heads.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from torchvision.models.detection import _utils as det_utils


class SyncFreeMatcher(det_utils.Matcher):
    """torchvision's ``Matcher`` (low-quality matches included), without a host read, for
    one image or a padded batch of them.

    Same constructor, same result: for each prediction the index of its best ground
    truth, ``BELOW_LOW_THRESHOLD`` (-1) under ``low_threshold``, ``BETWEEN_THRESHOLDS``
    (-2) from ``low_threshold`` up to ``high_threshold``; with
    ``allow_low_quality_matches``, every prediction that ties for a ground truth's best
    overlap keeps its best ground truth whatever its overlap (torchvision's rule).
    """

    def __call__(self, match_quality_matrix: Tensor, gt_valid: Tensor | None = None) -> Tensor:
        """Args:
            match_quality_matrix: ``[..., G, P]`` overlaps in ``[0, 1]`` (G, P >= 1).
            gt_valid: ``[..., G]`` bool, False for a padding row, which matches nothing;
                None when every row is a ground truth.

        Returns:
            ``[..., P]`` int64.
        """
        if match_quality_matrix.numel() == 0:
            side = "ground-truth" if match_quality_matrix.shape[-2] == 0 else "proposal"
            raise ValueError(f"No {side} boxes available for one of the images during training")
        if gt_valid is not None:
            match_quality_matrix = torch.where(gt_valid[..., None], match_quality_matrix, -1.0)
        matched_vals, all_matches = match_quality_matrix.max(dim=-2)
        below = torch.full_like(all_matches, self.BELOW_LOW_THRESHOLD)
        between = torch.full_like(all_matches, self.BETWEEN_THRESHOLDS)
        matches = torch.where(
            matched_vals < self.low_threshold,
            below,
            torch.where(matched_vals < self.high_threshold, between, all_matches),
        )
        if not self.allow_low_quality_matches:
            return matches
        highest_per_gt = match_quality_matrix.max(dim=-1).values  # [..., G]
        if gt_valid is not None:  # a padding row's best (-1) is no one's best overlap
            highest_per_gt = torch.where(gt_valid, highest_per_gt, torch.inf)
        ties = (match_quality_matrix == highest_per_gt[..., None]).any(dim=-2)  # [..., P]
        return torch.where(ties, all_matches, matches)


def pad_boxes(boxes: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Each image's boxes in one padded batch, and which rows are boxes.

    Args:
        boxes: per image ``[G_i, 4]``.

    Returns:
        ``([B, G_max, 4], [B, G_max] bool)``: zeros and False in the padding rows. The
        mask is made on the boxes' device from their shapes, without a host-to-device copy
        (which waits for the device as a read does).
    """
    padded = pad_sequence(boxes, batch_first=True)
    valid = pad_sequence([b.new_ones(b.shape[0], dtype=torch.bool) for b in boxes], True)
    return padded, valid


def box_iou_batched(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """torchvision's ``box_iou``, operation for operation (the same values to the bit), of
    a batch of box sets, without its ``[..., N, M, 2]`` intermediates.

    Args:
        boxes1: ``[..., N, 4]`` xyxy.
        boxes2: ``[..., M, 4]`` xyxy, its leading dimensions broadcast with ``boxes1``'s.

    Returns:
        ``[..., N, M]`` IoU.
    """
    area1, area2 = _box_area(_upcast(boxes1)), _box_area(_upcast(boxes2))
    first, second = boxes1[..., :, None, :], boxes2[..., None, :, :]
    width = torch.min(first[..., 2], second[..., 2]) - torch.max(first[..., 0], second[..., 0])
    height = torch.min(first[..., 3], second[..., 3]) - torch.max(first[..., 1], second[..., 1])
    inter = _upcast(width).clamp(min=0) * _upcast(height).clamp(min=0)
    union = area1[..., :, None] + area2[..., None, :] - inter
    return inter / union


def _box_area(boxes: Tensor) -> Tensor:
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def _upcast(boxes: Tensor) -> Tensor:
    """Half-precision boxes in float32, as torchvision's box operations take them."""
    return boxes.float() if boxes.dtype in (torch.float16, torch.bfloat16) else boxes


def random_subset(
    eligible: Tensor, keys: Tensor, *, most: int, take: Tensor | None = None
) -> Tensor:
    """A uniformly random subset of the eligible elements of each row, of
    ``min(count, most, take)``.

    Args:
        eligible: ``[..., N]`` bool.
        keys: ``[..., N]`` independent uniform draws in ``[0, 1)`` (float64: few ties).
        most: a fixed cap on the subset's size (a Python int: the shape of ``topk``).
        take: ``[...]`` int64, a smaller size wanted per row that may depend on the data
            (it is never read on the host); None for ``most``.

    Returns:
        ``[..., N]`` bool, True for the elements chosen: those with the largest keys.
    """
    k = min(most, eligible.shape[-1])
    values, index = torch.where(eligible, keys, -1.0).topk(k, dim=-1)
    chosen = values >= 0
    if take is not None:
        chosen &= torch.arange(k, device=eligible.device) < take[..., None]
    return torch.zeros_like(eligible).scatter(-1, index, chosen)


def sample_balanced(
    labels: Tensor, *, batch_size: int, positive_fraction: float
) -> tuple[Tensor, Tensor]:
    """torchvision's balanced sampling of each image's elements, with no host read.

    ``min(#positives, int(batch_size * positive_fraction))`` random positives, then
    ``min(#negatives, batch_size - positives taken)`` random negatives, each a uniformly
    random subset, as ``BalancedPositiveNegativeSampler`` draws them with ``randperm``.

    Args:
        labels: ``[..., N]``, a row per image: ``>= 1`` positive, ``0`` negative, ``< 0``
            ignored (padding included).

    Returns:
        ``(positive, negative)``, ``[..., N]`` bool masks of the elements sampled.
    """
    keys = torch.rand(labels.shape, device=labels.device, dtype=torch.float64)
    positive = random_subset(labels >= 1, keys, most=int(batch_size * positive_fraction))
    taken = positive.sum(dim=-1)
    negative = random_subset(labels == 0, keys, most=batch_size, take=batch_size - taken)
    return positive, negative


class SyncFreeSampler(det_utils.BalancedPositiveNegativeSampler):
    """``BalancedPositiveNegativeSampler`` by :func:`sample_balanced`, all images at once:
    the same interface (per image ``uint8`` masks of the positives and negatives sampled)
    and the same law of samples, drawn from the same torch RNG by other calls: a seed gives
    other samples than torchvision's sampler draws."""

    def __call__(self, matched_idxs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        lengths = [labels.shape[0] for labels in matched_idxs]
        # The images' rows side by side, a shorter one padded with ignored elements.
        rows = pad_sequence(matched_idxs, batch_first=True, padding_value=-1)
        positive, negative = sample_balanced(
            rows, batch_size=self.batch_size_per_image, positive_fraction=self.positive_fraction
        )
        return unpad(positive.to(torch.uint8), lengths), unpad(negative.to(torch.uint8), lengths)


def unpad(rows: Tensor, lengths: list[int]) -> list[Tensor]:
    """Each ``[N_max, ...]`` row of ``rows`` cut to its own length ``N_i``."""
    if all(n == rows.shape[1] for n in lengths):
        return list(rows.unbind())
    return [row[:n] for row, n in zip(rows.unbind(), lengths, strict=True)]


def first_true(mask: Tensor, k: int) -> Tensor:
    """The indices of each row's first ``k`` True elements, ascending, where it has as many.

    Args:
        mask: ``[..., N]`` bool (or 0/1 integers).
        k: how many indices, ``<= N`` (a Python int: the result's shape).

    Returns:
        ``[..., k]`` int64: the True elements' indices in ascending order, then (where fewer
        than ``k`` are True) the first False elements'. ``mask[result]`` says which are which.
    """
    # A stable sort keeps each group in index order: torch.where(mask)[0] without its read.
    order = torch.argsort(mask.to(torch.uint8), dim=-1, descending=True, stable=True)
    return order[..., :k]


def true_indices(masks: list[Tensor]) -> list[Tensor]:
    """``torch.where(mask)[0]`` of each mask, with one read of the device for them all
    (their counts) instead of one per mask.

    Args:
        masks: ``[N_i]`` bool, at least one.

    Returns:
        Per mask, ``[n_i]`` int64: its True elements' indices, ascending.
    """
    counts = torch.stack([mask.sum() for mask in masks]).tolist()  # the one read
    return [first_true(mask, n) for mask, n in zip(masks, counts, strict=True)]
