"""torchvision's RegionProposalNetwork with separate train/test NMS thresholds, and
without host reads in training (and inference on a GPU) but the ones NMS needs.

TAO has ``train_rpn_nms_threshold`` and ``test_rpn_nms_thresh``; torchvision has one
``nms_thresh``. The rules (per-level pre-NMS top-n, NMS per level, post-NMS top-n per
image, the anchor matcher and the balanced sampler) are torchvision's, fed from the spec.

What differs is how they run. torchvision's ``filter_proposals`` drops small and
low-scoring boxes and runs NMS per level with a ``torch.where`` or ``torch.unique`` at each
turn, its matcher and sampler pick anchors with boolean masks, and its loss gathers the
sampled anchors with ``torch.where``: on a GPU, a dozen and more waits for the device per
image and step. Here the filtered-out boxes stay in NMS's input in a group of their own,
matching and sampling are fixed-shape (:mod:`.sampling`) and run for the batch's images at
once, and the losses are masked sums: one NMS per image and one read of the boxes kept,
for the whole batch. That read also brings back the check that every target box has a
positive width and height (torchvision's, which the model made with a read of its own).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.rpn import RegionProposalNetwork
from torchvision.ops import boxes as box_ops

from .box_coder import HostScalarBoxCoder
from .nms import greedy_nms_by_segment, nms_kept_mask
from .sampling import SyncFreeMatcher, SyncFreeSampler, box_iou_batched, pad_boxes

MIN_PROPOSAL_SIZE = 1e-3
"""Floor for rpn_min_size: a zero-width proposal would give infinite box-regression
targets in the RoI head (log of 0), so rpn_min_size 0 means torchvision's 1e-3 px."""


OVERLAPS_AT_ONCE = 2**27
"""The most ground-truth/anchor overlaps the anchor matching computes at once (512 MiB in
float32, a few times that with the matcher's temporaries)."""


def degenerate_box_found(boxes: list[Tensor]) -> Tensor:
    """Whether a box of ``boxes`` (per image ``[N_i, 4]`` xyxy) has no positive width or
    height: a 0-dim bool on their device, read by the caller when it reads anyway."""
    every = torch.cat(boxes)
    return (every[:, 2:] <= every[:, :2]).any()


def raise_for_degenerate_box(boxes: list[Tensor]) -> None:
    """Fail naming the first image of ``boxes`` (per image ``[N_i, 4]`` xyxy) with a box
    that has no positive width or height, and that box. Reads the device per image: it
    runs once a check found one, before the run stops.

    Raises:
        ValueError: such a box, if any.
    """
    for index, image_boxes in enumerate(boxes):
        flags = (image_boxes[:, 2:] <= image_boxes[:, :2]).any(dim=1)
        if bool(flags.any()):
            box = image_boxes[flags.nonzero()[0, 0]].tolist()
            raise ValueError(
                f"target {index}: every box must have a positive width and height, got {box}"
            )


class TrainTestRPN(RegionProposalNetwork):
    """``nms_thresh`` reads the training or testing threshold by ``self.training``."""

    def __init__(
        self,
        *,
        anchor_generator: AnchorGenerator,
        head: nn.Module,
        fg_iou_thresh: float,
        bg_iou_thresh: float,
        batch_size_per_image: int,
        positive_fraction: float,
        pre_nms_top_n: dict[str, int],
        post_nms_top_n: dict[str, int],
        nms_thresh: dict[str, float],
        min_size: float,
    ) -> None:
        super().__init__(
            anchor_generator,
            head,
            fg_iou_thresh,
            bg_iou_thresh,
            batch_size_per_image,
            positive_fraction,
            pre_nms_top_n,
            post_nms_top_n,
            nms_thresh["training"],
        )
        self._nms_thresh = {"training": nms_thresh["training"], "testing": nms_thresh["testing"]}
        self.min_size = max(float(min_size), MIN_PROPOSAL_SIZE)
        self.box_coder = HostScalarBoxCoder(weights=(1.0, 1.0, 1.0, 1.0))  # torchvision's
        self.proposal_matcher = SyncFreeMatcher(
            fg_iou_thresh, bg_iou_thresh, allow_low_quality_matches=True
        )
        self.fg_bg_sampler = SyncFreeSampler(batch_size_per_image, positive_fraction)
        self.one_nms_per_batch = False
        """One NMS call for the batch's proposals instead of one per image: one read
        instead of B, and on a GPU B times the pairs to compare (a tuning switch,
        ``DeviceTuning.one_nms_per_batch``)."""
        self.segmented_nms = False
        """Each (image, level)'s NMS settled side by side (:func:`greedy_nms_by_segment`)
        instead of one NMS call per image (a tuning switch,
        ``DeviceTuning.segmented_nms``)."""
        self._unchecked_boxes: list[Tensor] | None = None
        """During a training :meth:`forward`, the targets' boxes until
        :meth:`filter_proposals` reads their check with its counts."""

    @property
    def nms_thresh(self) -> float:
        return self._nms_thresh["training" if self.training else "testing"]

    @nms_thresh.setter
    def nms_thresh(self, value: float) -> None:
        """Assigning one threshold (as torchvision's ``__init__`` does) sets both modes."""
        self._nms_thresh = {"training": value, "testing": value}

    def forward(
        self,
        images: ImageList,
        features: dict[str, Tensor],
        targets: list[dict[str, Tensor]] | None = None,
    ) -> tuple[list[Tensor], dict[str, Tensor]]:
        """torchvision's RPN: per image ``[P_i, 4]`` proposals, and the losses in training.

        In training it also fails on a target box without a positive width and height
        (:func:`raise_for_degenerate_box`), before a loss is computed from one: the check
        is read with the boxes kept per image (:meth:`filter_proposals`), not on its own.

        Args:
            images: the batch ``[B, 3, H, W]`` and each image's ``(H, W)``.
            features: FPN maps ``{"p{l}": [B, C, H_l, W_l]}``.
            targets: training only: per image ``boxes`` ``[G_i, 4]`` xyxy.
        """
        if not self.training or targets is None:
            return super().forward(images, features, targets)
        self._unchecked_boxes = [t["boxes"] for t in targets]
        try:
            proposals, losses = super().forward(images, features, targets)
            unchecked = self._unchecked_boxes
        finally:
            self._unchecked_boxes = None
        if unchecked is not None and bool(degenerate_box_found(unchecked)):
            # filter_proposals kept torchvision's code (traced or scripted): no read to join.
            raise_for_degenerate_box(unchecked)
        return proposals, losses

    def filter_proposals(
        self,
        proposals: Tensor,
        objectness: Tensor,
        image_shapes: list[tuple[int, int]],
        num_anchors_per_level: list[int],
    ) -> tuple[list[Tensor], list[Tensor]]:
        """torchvision's proposal filtering, with one read for the batch of how many boxes
        each image keeps (and one NMS call per image on a GPU), in training and on a GPU.

        Per image and level the ``pre_nms_top_n`` best-scoring boxes, clipped to the
        image; those smaller than ``min_size`` or scoring under ``score_thresh`` dropped;
        NMS within each level; the ``post_nms_top_n`` best kept, by decreasing score.

        Args:
            proposals: ``[B, A, 4]`` decoded xyxy boxes, input pixels.
            objectness: ``[B * A, 1]`` logits.
            image_shapes: per image ``(H, W)``.
            num_anchors_per_level: ``A`` split by FPN level.

        Returns:
            Per image ``[P_i, 4]`` boxes and ``[P_i]`` sigmoid scores.
        """
        if (
            not (self.training or proposals.is_cuda)
            or torch.jit.is_tracing()
            or torch.jit.is_scripting()
        ):
            # Export keeps torchvision's code: a traced graph must not hold the tracing
            # example's counts (the read below would freeze them). So does inference on a
            # CPU, where reads cost nothing, so that its detections stay the exported
            # graph's to the last bit; on a GPU inference reads as little as training.
            return super().filter_proposals(
                proposals, objectness, image_shapes, num_anchors_per_level
            )
        num_images = proposals.shape[0]
        device = proposals.device
        objectness = objectness.detach().reshape(num_images, -1)
        levels = torch.cat(
            [
                torch.full((n,), level, dtype=torch.int64, device=device)
                for level, n in enumerate(num_anchors_per_level)
            ]
        )
        top_n_idx = self._get_top_n_idx(objectness, num_anchors_per_level)  # [B, K]
        batch_idx = torch.arange(num_images, device=device)[:, None]
        scores = torch.sigmoid(objectness[batch_idx, top_n_idx])
        boxes = torch.stack(
            [
                box_ops.clip_boxes_to_image(image_boxes, shape)
                for image_boxes, shape in zip(
                    proposals[batch_idx, top_n_idx], image_shapes, strict=True
                )
            ]
        )
        levels = levels[top_n_idx]
        if self.segmented_nms:
            kept = self._kept_by_segment(boxes, scores, num_anchors_per_level)
        elif self.one_nms_per_batch:  # each image's levels are groups of one call
            groups = batch_idx * len(num_anchors_per_level) + levels
            flat_boxes, flat_scores = boxes.reshape(-1, 4), scores.reshape(-1)
            usable = self._usable(flat_boxes, flat_scores)
            kept = nms_kept_mask(
                flat_boxes, flat_scores, groups.reshape(-1), usable, self.nms_thresh
            ).view_as(scores)
        else:
            kept = torch.stack(
                [
                    nms_kept_mask(b, s, lvl, self._usable(b, s), self.nms_thresh)
                    for b, s, lvl in zip(boxes, scores, levels, strict=True)
                ]
            )
        best = torch.where(kept, scores, -1.0).topk(
            min(self.post_nms_top_n(), scores.shape[1]), dim=1
        )
        counts = self._read_counts((best.values >= 0).sum(dim=1))  # the one read of the batch
        final_boxes = [boxes[i, best.indices[i, :n]] for i, n in enumerate(counts)]
        final_scores = [best.values[i, :n] for i, n in enumerate(counts)]
        return final_boxes, final_scores

    def _kept_by_segment(
        self, boxes: Tensor, scores: Tensor, num_anchors_per_level: list[int]
    ) -> Tensor:
        """``[B, K]`` bool, the boxes NMS keeps of :meth:`filter_proposals`' top-n (``[B, K,
        4]`` and ``[B, K]``: level after level, each level's by decreasing score), every
        (image, level) a segment of :func:`greedy_nms_by_segment`, padded to the longest
        level's count with a box that is never usable."""
        counts = [min(self.pre_nms_top_n(), n) for n in num_anchors_per_level]
        total, offsets = boxes.shape[1], torch.arange(max(counts), device=boxes.device)
        # Index tensors made on the device from Python numbers (no host data to copy over);
        # a level's padding points at column ``total``, the unusable box appended.
        columns = torch.stack(
            [
                torch.where(offsets < count, offsets + sum(counts[:level]), total)
                for level, count in enumerate(counts)
            ]
        )  # [levels, longest]
        usable = self._usable(boxes.reshape(-1, 4), scores.reshape(-1)).view_as(scores)
        usable = torch.cat([usable, torch.zeros_like(usable[:, :1])], dim=1)
        boxes = torch.cat([boxes, torch.zeros_like(boxes[:, :1])], dim=1)
        by_segment = greedy_nms_by_segment(
            boxes[:, columns].flatten(0, 1), usable[:, columns].flatten(0, 1), self.nms_thresh
        )
        kept = torch.zeros_like(usable)
        kept[:, columns] = by_segment.view(usable.shape[0], *columns.shape)  # padding: False
        return kept[:, :total]

    def _read_counts(self, kept: Tensor) -> list[int]:
        """``kept`` (``[B]`` int64, the boxes kept per image) on the host, and with it the
        check of the targets' boxes that :meth:`forward` left pending, in the same copy.

        Raises:
            ValueError: a target box has no positive width or height.
        """
        boxes, self._unchecked_boxes = self._unchecked_boxes, None
        if boxes is None:
            counts: list[int] = kept.tolist()
            return counts
        found = degenerate_box_found(boxes).to(kept.device, kept.dtype)
        *counts, degenerate = torch.cat([kept, found[None]]).tolist()
        if degenerate:
            raise_for_degenerate_box(boxes)
        return counts

    def _usable(self, boxes: Tensor, scores: Tensor) -> Tensor:
        """``[K]`` bool: not smaller than ``min_size`` (torchvision's ``remove_small_boxes``)
        and scoring at least ``score_thresh``."""
        widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        large_enough = (widths >= self.min_size) & (heights >= self.min_size)
        return large_enough & (scores >= self.score_thresh)

    def assign_targets_to_anchors(
        self, anchors: list[Tensor], targets: list[dict[str, Tensor]]
    ) -> tuple[list[Tensor], list[Tensor]]:
        """torchvision's anchor labels (1 object, 0 background, -1 ignored) and matched
        ground-truth boxes, ``[A]`` and ``[A, 4]`` per image, for all images at once.

        The images' ground truths are padded to the batch's most; every image has the same
        anchors (they follow the batch's padded size), so the overlaps are one
        ``[B, G_max, A]`` tensor, made a few images at a time where it would be larger than
        :data:`OVERLAPS_AT_ONCE`. An image without ground truth has every anchor negative.
        """
        if len({a.shape for a in anchors}) != 1:
            raise ValueError("every image of a batch must have the same anchors")
        gt_boxes, gt_valid = pad_boxes([t["boxes"] for t in targets])
        num_anchors = anchors[0].shape[0]
        if gt_boxes.shape[1] == 0:  # only background images: every anchor is negative
            labels = anchors[0].new_zeros((len(anchors), num_anchors))
            return list(labels.unbind()), list(torch.zeros_like(torch.stack(anchors)).unbind())
        # A few images at a time where they are crowded: [B, G_max, A] in float32 is 1.7 GB
        # at 16 images of 93 objects and 832x1344's 279,000 anchors.
        step = max(1, OVERLAPS_AT_ONCE // (gt_boxes.shape[1] * num_anchors))
        matched = torch.cat(
            [
                self.proposal_matcher(
                    box_iou_batched(gt_boxes[i : i + step], anchors[0]), gt_valid[i : i + step]
                )
                for i in range(0, len(anchors), step)
            ]
        )  # [B, A]
        batch_index = torch.arange(len(anchors), device=matched.device)[:, None]
        matched_gt_boxes = gt_boxes[batch_index, matched.clamp(min=0)]  # [B, A, 4]
        ignored = matched == self.proposal_matcher.BETWEEN_THRESHOLDS
        labels = torch.where(ignored, -1.0, (matched >= 0).to(torch.float32))
        return list(labels.unbind()), list(matched_gt_boxes.unbind())

    def compute_loss(
        self,
        objectness: Tensor,
        pred_bbox_deltas: Tensor,
        labels: list[Tensor],
        regression_targets: list[Tensor],
    ) -> tuple[Tensor, Tensor]:
        """torchvision's RPN losses, as sums over the sampled anchors' masks.

        Args:
            objectness: ``[B * A, 1]`` logits.
            pred_bbox_deltas: ``[B * A, 4]``.
            labels: per image ``[A]`` (1, 0 or -1 ignored).
            regression_targets: per image ``[A, 4]``.

        Returns:
            ``(objectness_loss, box_loss)``: the mean binary cross-entropy over the sampled
            anchors, and the smooth-L1 (beta 1/9) sum over the sampled positives divided by
            the number sampled.
        """
        positive_masks, negative_masks = self.fg_bg_sampler(labels)
        positive = torch.cat(positive_masks).bool()
        sampled = positive | torch.cat(negative_masks).bool()
        count = sampled.sum().clamp(min=1)
        box_loss = F.smooth_l1_loss(
            pred_bbox_deltas, torch.cat(regression_targets), beta=1 / 9, reduction="none"
        ).sum(dim=1)
        objectness_loss = F.binary_cross_entropy_with_logits(
            objectness.flatten(), torch.cat(labels).clamp(min=0), reduction="none"
        )
        return (
            torch.where(sampled, objectness_loss, 0.0).sum() / count,
            torch.where(positive, box_loss, 0.0).sum() / count,
        )
