"""TAO's importance rules as pure functions."""

from __future__ import annotations

import math

import pytest
import torch

from maskops.prune.importance import (
    channels_to_prune,
    equalize,
    filter_norms,
    normalize_norms,
    num_channels_to_keep,
)


def test_filter_norms_are_per_output_filter() -> None:
    weight = torch.zeros(3, 2, 1, 1)
    weight[0, :, 0, 0] = torch.tensor([3.0, 4.0])
    weight[2, 1, 0, 0] = -2.0
    assert filter_norms(weight).tolist() == [5.0, 0.0, 2.0]


def test_normalisers() -> None:
    norms = torch.tensor([3.0, 4.0, 0.0])
    assert normalize_norms(norms, "max").tolist() == pytest.approx([0.75, 1.0, 0.0])
    assert normalize_norms(norms, "L2").tolist() == pytest.approx([0.6, 0.8, 0.0])
    # An all-zero layer normalises to zeros, not NaN.
    assert normalize_norms(torch.zeros(4), "max").tolist() == [0.0] * 4


def test_equalization_keep_rules() -> None:
    a = torch.tensor([0.9, 0.05, 0.05, 0.5])
    b = torch.tensor([0.05, 0.9, 0.05, 0.5])
    threshold = 0.3
    union = equalize([a, b], "union") >= threshold
    intersection = equalize([a, b], "intersection") >= threshold
    assert union.tolist() == [True, True, False, True]
    assert intersection.tolist() == [False, False, False, True]
    assert equalize([a, b], "arithmetic_mean").tolist() == pytest.approx([0.475, 0.475, 0.05, 0.5])
    geometric = math.sqrt(0.9 * 0.05)
    assert equalize([a, b], "geometric_mean").tolist() == pytest.approx(
        [geometric, geometric, 0.05, 0.5]
    )


@pytest.mark.parametrize(
    ("above", "granularity", "min_filters", "expected"),
    [
        (64, 8, 16, 64),  # nothing under the threshold
        (0, 8, 16, 16),  # everything under: the minimum
        (17, 8, 16, 24),  # rounded up to the granularity
        (3, 8, 12, 16),  # the minimum itself is rounded up
        (61, 16, 16, 64),  # rounding never exceeds the layer
        (10, 1, 16, 16),
    ],
)
def test_kept_count(above: int, granularity: int, min_filters: int, expected: int) -> None:
    scores = torch.cat([torch.ones(above), torch.zeros(64 - above)])
    kept = num_channels_to_keep(
        scores, threshold=0.5, granularity=granularity, min_filters=min_filters
    )
    assert kept == expected


def test_channels_to_prune_drops_the_lowest_scores_deterministically() -> None:
    scores = torch.tensor([0.2, 0.9, 0.2, 0.5, 0.1])
    assert channels_to_prune(scores, 3) == [2, 4]  # the tie at 0.2 keeps the lower index
    assert channels_to_prune(scores, 5) == []
