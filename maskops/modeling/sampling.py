"""Anchor/proposal matching and sampling without a host read: torchvision's rules, in
fixed-shape tensor operations.

torchvision's ``Matcher`` and ``BalancedPositiveNegativeSampler`` pick their elements with
``torch.where(mask)`` and boolean-mask assignments. On a GPU each of those waits for the
device to learn how many elements it picked, several times per image per step, and the
device then idles while the host catches up. The same rules, written with ``torch.where``'s
three-argument form, ``topk`` over random keys and index scatters, give the same matches
and the same law of samples with shapes that never depend on the data.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.models.detection import _utils as det_utils


class SyncFreeMatcher(det_utils.Matcher):
    """torchvision's ``Matcher`` (low-quality matches included), without a host read.

    Same constructor, same result: for each prediction the index of its best ground
    truth, ``BELOW_LOW_THRESHOLD`` (-1) under ``low_threshold``, ``BETWEEN_THRESHOLDS``
    (-2) from ``low_threshold`` up to ``high_threshold``; with
    ``allow_low_quality_matches``, every prediction that ties for a ground truth's best
    overlap keeps its best ground truth whatever its overlap (torchvision's rule).
    """

    def __call__(self, match_quality_matrix: Tensor) -> Tensor:
        """``match_quality_matrix``: ``[G, P]`` overlaps (G, P >= 1). Returns ``[P]`` int64."""
        if match_quality_matrix.numel() == 0:
            side = "ground-truth" if match_quality_matrix.shape[0] == 0 else "proposal"
            raise ValueError(f"No {side} boxes available for one of the images during training")
        matched_vals, all_matches = match_quality_matrix.max(dim=0)
        below = torch.full_like(all_matches, self.BELOW_LOW_THRESHOLD)
        between = torch.full_like(all_matches, self.BETWEEN_THRESHOLDS)
        matches = torch.where(
            matched_vals < self.low_threshold,
            below,
            torch.where(matched_vals < self.high_threshold, between, all_matches),
        )
        if not self.allow_low_quality_matches:
            return matches
        highest_per_gt = match_quality_matrix.max(dim=1).values  # [G]
        ties = (match_quality_matrix == highest_per_gt[:, None]).any(dim=0)  # [P]
        return torch.where(ties, all_matches, matches)


def random_subset(
    eligible: Tensor, keys: Tensor, *, most: int, take: Tensor | None = None
) -> Tensor:
    """A uniformly random subset of the eligible elements, of ``min(count, most, take)``.

    Args:
        eligible: ``[N]`` bool.
        keys: ``[N]`` independent uniform draws in ``[0, 1)`` (float64: few ties).
        most: a fixed cap on the subset's size (a Python int: the shape of ``topk``).
        take: a smaller size wanted, a 0-d int64 tensor that may depend on the data (it
            is never read on the host); None for ``most``.

    Returns:
        ``[N]`` bool, True for the elements chosen: those with the largest keys.
    """
    k = min(most, eligible.shape[0])
    values, index = torch.where(eligible, keys, -1.0).topk(k)
    chosen = values >= 0
    if take is not None:
        chosen &= torch.arange(k, device=eligible.device) < take
    return torch.zeros_like(eligible).scatter(0, index, chosen)


def sample_balanced(
    labels: Tensor, *, batch_size: int, positive_fraction: float
) -> tuple[Tensor, Tensor]:
    """torchvision's balanced sampling of one image's elements, with no host read.

    ``min(#positives, int(batch_size * positive_fraction))`` random positives, then
    ``min(#negatives, batch_size - positives taken)`` random negatives, each a uniformly
    random subset, as ``BalancedPositiveNegativeSampler`` draws them with ``randperm``.

    Args:
        labels: ``[N]``: ``>= 1`` positive, ``0`` negative, ``< 0`` ignored.

    Returns:
        ``(positive, negative)``, ``[N]`` bool masks of the elements sampled.
    """
    keys = torch.rand(labels.shape, device=labels.device, dtype=torch.float64)
    positive = random_subset(labels >= 1, keys, most=int(batch_size * positive_fraction))
    negative = random_subset(labels == 0, keys, most=batch_size, take=batch_size - positive.sum())
    return positive, negative


class SyncFreeSampler(det_utils.BalancedPositiveNegativeSampler):
    """``BalancedPositiveNegativeSampler`` by :func:`sample_balanced`: the same interface
    (per image ``uint8`` masks of the positives and negatives sampled) and the same law of
    samples, drawn from the same torch RNG by other calls: a seed gives other samples than
    torchvision's sampler draws."""

    def __call__(self, matched_idxs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        positives, negatives = [], []
        for labels in matched_idxs:
            positive, negative = sample_balanced(
                labels,
                batch_size=self.batch_size_per_image,
                positive_fraction=self.positive_fraction,
            )
            positives.append(positive.to(torch.uint8))
            negatives.append(negative.to(torch.uint8))
        return positives, negatives


def first_true(mask: Tensor, k: int) -> Tensor:
    """The indices of ``mask``'s first ``k`` True elements, ascending, where it has as many.

    Args:
        mask: ``[N]`` bool (or 0/1 integers).
        k: how many indices, ``<= N`` (a Python int: the result's shape).

    Returns:
        ``[k]`` int64: the True elements' indices in ascending order, then (where fewer
        than ``k`` are True) the first False elements'. ``mask[result]`` says which are which.
    """
    # A stable sort keeps each group in index order: torch.where(mask)[0] without its read.
    return torch.argsort(mask.to(torch.uint8), descending=True, stable=True)[:k]


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
