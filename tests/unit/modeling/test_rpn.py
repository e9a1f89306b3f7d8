"""The RPN's training path gives torchvision's proposals, anchor labels and losses."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from torchvision.models.detection.rpn import RegionProposalNetwork

from maskops.modeling import build_model
from maskops.modeling import rpn as rpn_module
from maskops.modeling.rpn import TrainTestRPN
from maskops.spec.models import MaskRCNNConfig
from tests.support.tiny_model import FixedSampler

LEVELS = [300, 120, 30]
"""Anchors per level in the synthetic inputs."""


def _rpns(
    tiny_config: Callable[..., MaskRCNNConfig], **overrides: float
) -> tuple[TrainTestRPN, RegionProposalNetwork]:
    """Ours, in training mode, and torchvision's with the same settings."""
    ours = build_model(tiny_config(**overrides), num_classes=4, image_size=(128, 128)).rpn
    theirs = RegionProposalNetwork(
        ours.anchor_generator,
        ours.head,
        ours.proposal_matcher.high_threshold,
        ours.proposal_matcher.low_threshold,
        ours.fg_bg_sampler.batch_size_per_image,
        ours.fg_bg_sampler.positive_fraction,
        ours._pre_nms_top_n,
        ours._post_nms_top_n,
        ours.nms_thresh,
    )
    theirs.min_size = ours.min_size
    return ours.train(), theirs.train()


def _integer_boxes(count: int, generator: torch.Generator, side: int = 40) -> Tensor:
    """``[count, 4]`` xyxy boxes on the integer grid (exact under NMS's offsets), some of
    them empty or reaching past a 128-pixel image."""
    corner = torch.randint(-8, 128, (count, 2), generator=generator).float()
    size = torch.randint(0, side, (count, 2), generator=generator).float()
    return torch.cat([corner, corner + size], dim=1)


@pytest.mark.parametrize(
    ("post_nms", "nms_threshold"), [(50, 0.7), (400, 0.3)]
)  # the second keeps fewer boxes than post_nms
def test_training_proposals_are_torchvisions(
    tiny_config: Callable[..., MaskRCNNConfig], post_nms: int, nms_threshold: float
) -> None:
    ours, theirs = _rpns(
        tiny_config,
        train_rpn_pre_nms_topn=100,
        train_rpn_post_nms_topn=post_nms,
        train_rpn_nms_threshold=nms_threshold,
        rpn_min_size=2.0,
    )
    generator = torch.Generator().manual_seed(0)
    images = 3
    proposals = torch.stack([_integer_boxes(sum(LEVELS), generator) for _ in range(images)])
    objectness = torch.randn((images * sum(LEVELS), 1), generator=generator)
    shapes = [(128, 128), (96, 128), (128, 64)]

    boxes, scores = ours.filter_proposals(proposals, objectness, shapes, LEVELS)
    expected_boxes, expected_scores = theirs.filter_proposals(proposals, objectness, shapes, LEVELS)
    assert [b.shape[0] for b in boxes] == [b.shape[0] for b in expected_boxes]
    ours.one_nms_per_batch = True  # the tuning switch: one call for the three images
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            ours.filter_proposals(proposals, objectness, shapes, LEVELS)[0], boxes, strict=True
        )
    )
    ours.one_nms_per_batch, ours.segmented_nms = False, True  # each (image, level) a segment
    segmented = ours.filter_proposals(proposals, objectness, shapes, LEVELS)
    together = zip(segmented[0] + segmented[1], boxes + scores, strict=True)
    assert all(torch.equal(a, b) for a, b in together)
    if post_nms == 400:
        assert all(b.shape[0] < 230 for b in boxes)  # fewer kept than the top-n allows
    for got, expected in zip(boxes + scores, expected_boxes + expected_scores, strict=True):
        assert torch.equal(got, expected)


@pytest.mark.gpu
def test_inference_on_a_gpu_proposes_what_torchvision_does(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    ours, _ = _rpns(tiny_config, test_rpn_pre_nms_topn=100, test_rpn_post_nms_topn=60)
    ours = ours.eval().cuda()
    generator = torch.Generator().manual_seed(4)
    proposals = torch.stack([_integer_boxes(sum(LEVELS), generator) for _ in range(2)]).cuda()
    objectness = torch.randn((2 * sum(LEVELS), 1), generator=generator).cuda()
    shapes = [(128, 128), (96, 128)]
    expected = RegionProposalNetwork.filter_proposals(ours, proposals, objectness, shapes, LEVELS)
    for segmented in (False, True):  # and with each (image, level) a segment of its own
        ours.segmented_nms = segmented
        got = ours.filter_proposals(proposals, objectness, shapes, LEVELS)
        for part, reference in zip(got, expected, strict=True):
            assert [t.shape for t in part] == [t.shape for t in reference]
            assert all(torch.equal(a, b) for a, b in zip(part, reference, strict=True))


def _anchor_targets() -> tuple[list[Tensor], list[dict[str, Tensor]]]:
    generator = torch.Generator().manual_seed(2)
    anchors = _integer_boxes(500, generator).clamp(0, 128)
    anchors[:, 2:] += 1  # positive sizes
    gt = [
        _integer_boxes(n, generator).clamp(0, 128) + torch.tensor([0, 0, 4, 4]) for n in (3, 0, 1)
    ]
    return [anchors] * 3, [{"boxes": b} for b in gt]


@pytest.mark.parametrize("overlaps_at_once", [rpn_module.OVERLAPS_AT_ONCE, 1, 1500])
def test_anchor_labels_are_torchvisions(
    tiny_config: Callable[..., MaskRCNNConfig],
    overlaps_at_once: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole batch at once, an image at a time, and two images at a time (3 rows of
    500 anchors): the same labels."""
    monkeypatch.setattr(rpn_module, "OVERLAPS_AT_ONCE", overlaps_at_once)
    ours, theirs = _rpns(tiny_config)
    anchors, targets = _anchor_targets()
    labels, matched = ours.assign_targets_to_anchors(anchors, targets)
    expected_labels, expected_matched = theirs.assign_targets_to_anchors(anchors, targets)
    for got, expected in zip(labels + matched, expected_labels + expected_matched, strict=True):
        assert torch.equal(got, expected)
    assert {-1.0, 0.0, 1.0} <= set(torch.cat(labels).tolist())


def test_rpn_losses_are_torchvisions_for_the_same_samples(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    ours, theirs = _rpns(tiny_config)
    anchors, targets = _anchor_targets()
    labels, matched = ours.assign_targets_to_anchors(anchors, targets)
    regression_targets = list(ours.box_coder.encode(matched, anchors))
    torch.manual_seed(3)
    sampler = FixedSampler(ours.fg_bg_sampler(labels))
    ours.fg_bg_sampler = theirs.fg_bg_sampler = sampler  # type: ignore[assignment]
    objectness = torch.randn((1500, 1), requires_grad=True)
    deltas = torch.randn((1500, 4), requires_grad=True)

    got = ours.compute_loss(objectness, deltas, labels, regression_targets)
    got_grads = torch.autograd.grad(got[0] + got[1], [objectness, deltas])
    expected = theirs.compute_loss(objectness, deltas, labels, regression_targets)
    expected_grads = torch.autograd.grad(expected[0] + expected[1], [objectness, deltas])
    for value, reference in zip([*got, *got_grads], [*expected, *expected_grads], strict=True):
        torch.testing.assert_close(value, reference, rtol=1e-6, atol=1e-7)


def test_a_batch_without_ground_truth_has_only_negative_anchors(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    ours, theirs = _rpns(tiny_config)
    anchors, _ = _anchor_targets()
    targets = [{"boxes": torch.zeros((0, 4))} for _ in anchors]
    labels, matched = ours.assign_targets_to_anchors(anchors, targets)
    expected_labels, expected_matched = theirs.assign_targets_to_anchors(anchors, targets)
    for got, expected in zip(labels + matched, expected_labels + expected_matched, strict=True):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("one_nms_per_batch", [False, True])
def test_a_box_without_a_positive_size_fails_in_the_proposals_read(
    tiny_config: Callable[..., MaskRCNNConfig], one_nms_per_batch: bool
) -> None:
    """The check rides on the read of the boxes kept (a training step's reads:
    tests/unit/training/test_host_reads.py), and fails before the RPN's losses are computed
    from the box (a log of 0)."""
    model = build_model(tiny_config(), num_classes=4, image_size=(128, 128)).train()
    model.rpn.one_nms_per_batch = one_nms_per_batch
    images = [torch.rand(3, 128, 128), torch.rand(3, 128, 128)]
    good = {"boxes": torch.tensor([[10.0, 10, 40, 40]]), "labels": torch.tensor([1])}
    flat = {
        "boxes": torch.tensor([[10.0, 10, 40, 40], [50, 20, 60, 20]]),
        "labels": torch.tensor([1, 2]),
    }
    model.rpn.assign_targets_to_anchors = _must_not_run
    with pytest.raises(ValueError, match=r"target 1: every box .* \[50\.0, 20\.0, 60\.0, 20\.0\]"):
        model(images, [good, flat])
    assert model.rpn._unchecked_boxes is None


def _must_not_run(*args: object) -> None:
    raise AssertionError("the RPN's targets were used before their check")


def test_the_box_check_is_read_on_its_own_where_proposals_take_torchvisions_code(
    tiny_config: Callable[..., MaskRCNNConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A traced forward keeps torchvision's proposal filtering, which reads nothing to add
    the check to: the RPN then reads it after its losses."""
    monkeypatch.setattr(TrainTestRPN, "filter_proposals", RegionProposalNetwork.filter_proposals)
    model = build_model(tiny_config(), num_classes=4, image_size=(128, 128)).train()
    images = [torch.rand(3, 128, 128)]
    flat = {"boxes": torch.tensor([[50.0, 20, 40, 30]]), "labels": torch.tensor([2])}
    with pytest.raises(ValueError, match=r"target 0: every box .* \[50\.0, 20\.0, 40\.0, 30\.0\]"):
        model(images, [flat])
    assert model.rpn._unchecked_boxes is None
    good = {
        "boxes": torch.tensor([[10.0, 10, 40, 40]]),
        "labels": torch.tensor([1]),
        "masks": torch.ones((1, 128, 128), dtype=torch.uint8),
    }
    assert set(model(images, [good])) >= {"loss_objectness", "loss_rpn_box_reg"}
