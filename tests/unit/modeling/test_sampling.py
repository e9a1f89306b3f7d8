"""Matching and sampling without host reads: torchvision's results and law of samples."""

from __future__ import annotations

import pytest
import torch
from torchvision.models.detection import _utils as det_utils
from torchvision.ops import box_iou

from maskops.modeling.sampling import (
    SyncFreeMatcher,
    SyncFreeSampler,
    box_iou_batched,
    first_true,
    pad_boxes,
    random_subset,
    sample_balanced,
    true_indices,
)
from maskops.training.host_reads import HostReadCounter


@pytest.mark.parametrize("low_quality", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_the_matcher_matches_as_torchvisions(low_quality: bool, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    # Overlaps on a 0.05 grid: many ties, for the best ground truth and for each one's best.
    overlaps = (torch.rand((5, 300), generator=generator) * 20).floor() / 20
    overlaps[2] = overlaps[2] * 0.2  # a ground truth whose best overlap is low
    ours = SyncFreeMatcher(0.7, 0.3, allow_low_quality_matches=low_quality)
    theirs = det_utils.Matcher(0.7, 0.3, allow_low_quality_matches=low_quality)
    assert torch.equal(ours(overlaps), theirs(overlaps.clone()))


def test_the_matcher_refuses_an_empty_matrix_as_torchvision_does() -> None:
    with pytest.raises(ValueError, match="No ground-truth boxes"):
        SyncFreeMatcher(0.7, 0.3)(torch.zeros((0, 4)))
    with pytest.raises(ValueError, match="No proposal boxes"):
        SyncFreeMatcher(0.7, 0.3)(torch.zeros((2, 0)))


@pytest.mark.parametrize(
    ("positives", "negatives", "ignored", "taken"),
    [
        (100, 500, 50, (32, 96)),  # enough of both: a quarter positives
        (5, 500, 0, (5, 123)),  # few positives: negatives fill the batch
        (100, 20, 30, (32, 20)),  # few negatives: the batch stays short
        (0, 0, 40, (0, 0)),  # nothing to sample
    ],
)
def test_balanced_sampling_takes_torchvisions_counts(
    positives: int, negatives: int, ignored: int, taken: tuple[int, int]
) -> None:
    torch.manual_seed(0)
    labels = torch.cat(
        [
            torch.randint(1, 4, (positives,)),
            torch.zeros(negatives, dtype=torch.int64),
            torch.full((ignored,), -1),
        ]
    )[torch.randperm(positives + negatives + ignored)]
    positive, negative = sample_balanced(labels, batch_size=128, positive_fraction=0.25)
    assert (int(positive.sum()), int(negative.sum())) == taken
    assert bool((labels[positive] >= 1).all()) and bool((labels[negative] == 0).all())

    reference = det_utils.BalancedPositiveNegativeSampler(128, 0.25)
    pos_masks, neg_masks = reference([labels])
    assert (int(pos_masks[0].sum()), int(neg_masks[0].sum())) == taken


def test_every_eligible_element_is_equally_likely_to_be_drawn() -> None:
    torch.manual_seed(0)
    eligible = torch.tensor([True, False, True, True, False, True, True])
    draws = 4000
    chosen = torch.zeros(7)
    for _ in range(draws):
        keys = torch.rand(7, dtype=torch.float64)
        chosen += random_subset(eligible, keys, most=3, take=torch.tensor(2)).float()
    frequency = chosen / draws
    assert frequency[~eligible].sum() == 0
    # 2 of 5 eligible: 0.4 each, a standard error of 0.008 over 4000 draws.
    assert torch.allclose(frequency[eligible], torch.full((5,), 0.4), atol=0.04)


def test_the_sampler_keeps_torchvisions_interface() -> None:
    torch.manual_seed(0)
    labels = [torch.tensor([1, 0, 0, -1, 2, 0]), torch.tensor([0, 0, 0])]
    positives, negatives = SyncFreeSampler(4, 0.5)(labels)
    assert [p.dtype for p in positives + negatives] == [torch.uint8] * 4
    assert [p.shape[0] for p in positives] == [6, 3]
    assert positives[0].tolist() == [1, 0, 0, 0, 1, 0]
    assert int(negatives[0].sum()) == 2 and int(negatives[1].sum()) == 3


def test_first_true_gives_the_true_indices_in_order_then_the_false() -> None:
    mask = torch.tensor([False, True, False, True, True, False])
    assert first_true(mask, 3).tolist() == [1, 3, 4]
    assert first_true(mask, 5).tolist() == [1, 3, 4, 0, 2]
    assert torch.equal(first_true(mask, 3), torch.where(mask)[0])


def test_true_indices_are_torch_wheres_read_once() -> None:
    masks = [torch.tensor([False, True, True]), torch.tensor([False]), torch.tensor([True])]
    with HostReadCounter() as reads:
        got = true_indices(masks)
    assert [t.tolist() for t in got] == [torch.where(m)[0].tolist() for m in masks]
    assert reads.total == 1, reads.by_call


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_batched_overlaps_are_torchvisions_to_the_bit(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)

    def boxes(count: int) -> torch.Tensor:
        corner = torch.rand((count, 2), generator=generator) * 100
        return torch.cat([corner, corner + torch.rand((count, 2), generator=generator) * 40], 1)

    gt = [boxes(n).to(dtype) for n in (4, 1, 3)]
    others = boxes(50).to(dtype)
    padded, valid = pad_boxes(gt)
    overlaps = box_iou_batched(padded, others)  # [3, 4, 50]
    assert valid.tolist() == [[True] * 4, [True, False, False, False], [True] * 3 + [False]]
    for image, boxes_of_image in enumerate(gt):
        expected = box_iou(boxes_of_image, others)
        assert torch.equal(overlaps[image, : len(boxes_of_image)], expected)


@pytest.mark.parametrize("low_quality", [True, False])
def test_a_padded_batch_matches_as_each_image_alone(low_quality: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    matcher = SyncFreeMatcher(0.7, 0.3, allow_low_quality_matches=low_quality)
    alone = [(torch.rand((g, 200), generator=generator) * 20).floor() / 20 for g in (5, 2, 3)]
    batch = torch.nn.utils.rnn.pad_sequence(alone, batch_first=True)
    valid = torch.nn.utils.rnn.pad_sequence(
        [torch.ones(len(m), dtype=torch.bool) for m in alone], True
    )
    matched = matcher(batch, valid)
    for image, overlaps in enumerate(alone):
        assert torch.equal(matched[image], matcher(overlaps))


def test_a_padded_batch_samples_each_images_counts() -> None:
    torch.manual_seed(0)
    labels = [torch.tensor([1, 0, 0, -1, 2, 0, 1, 1]), torch.tensor([0, 0, 1]), torch.tensor([-1])]
    positives, negatives = SyncFreeSampler(4, 0.5)(labels)
    assert [len(p) for p in positives] == [len(n) for n in negatives] == [8, 3, 1]
    assert [int(p.sum()) for p in positives] == [2, 1, 0]
    assert [int(n.sum()) for n in negatives] == [2, 2, 0]
    for row, pos, neg in zip(labels, positives, negatives, strict=True):
        assert bool((row[pos.bool()] >= 1).all()) and bool((row[neg.bool()] == 0).all())
