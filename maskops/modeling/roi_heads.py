"""torchvision's RoIHeads with TF/TAO proposal sampling and TF-style mask targets.

Two things differ from torchvision in what is computed, both because the spec asks for TF
semantics:

* Proposal labelling (:class:`RangeMatcher`): foreground if IoU >= ``fg_thresh``,
  background if ``bg_thresh_lo <= IoU < bg_thresh_hi``, ignored otherwise (torchvision has
  one threshold: everything below it is background). Images without ground truth keep
  torchvision's behaviour (every proposal is background).
* Mask targets (:func:`project_masks_via_gt_crops`): as in TF Mask R-CNN, each ground-truth
  mask is first cropped to its own box and resampled to ``gt_mask_size`` squared, and each
  positive proposal's ``M x M`` target is then cut from that crop (zero outside the ground
  truth box). torchvision instead samples the full-image mask at ``M x M`` directly, which
  is the limit of a very large gt_mask_size. Targets stay soft (bilinear values in 0..1),
  as torchvision's are.

Sampling follows torchvision's rules without reading the device's state on the host
(:mod:`.sampling`), for the images of a batch at once, their proposals padded to the most
of any: each image keeps ``min(batch_size_per_image, that most)`` slots, the sampled
proposals first in index order (the rows torchvision's ``torch.where`` gives), and a slot
left empty, when too few proposals can be sampled, has the label -1 and counts in no loss.
The mask branch reads the positives' count once per batch and makes their targets for the
batch at once. On a GPU, inference picks its detections with one read for the batch too
(:meth:`SpecRoIHeads.detections_with_few_reads`).

The mask branch is optional (``include_mask=False`` gives Faster R-CNN heads). Keypoints
are not supported. Loss keys are torchvision's: ``loss_classifier``, ``loss_box_reg``,
``loss_mask``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.roi_heads import RoIHeads, maskrcnn_inference
from torchvision.ops import boxes as box_ops
from torchvision.ops import roi_align

from maskops.mask_crops import MASK_ORIGINS

from .box_coder import HostScalarBoxCoder
from .nms import nms_by_group
from .sampling import (
    SyncFreeSampler,
    box_iou_batched,
    first_true,
    pad_boxes,
    true_indices,
    unpad,
)

EMPTY_SLOT = -1
"""The label of a sampling slot that holds no sampled proposal (it counts in no loss)."""


class RangeMatcher(det_utils.Matcher):
    """Proposal-to-ground-truth matcher with TF's three thresholds.

    Returns, per proposal, the index of the best-overlapping ground truth if its IoU is
    >= ``fg_thresh``; ``BELOW_LOW_THRESHOLD`` (-1, background) if it lies in
    ``[bg_thresh_lo, bg_thresh_hi)``; ``BETWEEN_THRESHOLDS`` (-2, ignored) otherwise.
    """

    def __init__(self, *, fg_thresh: float, bg_thresh_hi: float, bg_thresh_lo: float) -> None:
        if bg_thresh_lo > bg_thresh_hi:
            raise ValueError(
                f"bg_thresh_lo ({bg_thresh_lo}) must not exceed bg_thresh_hi ({bg_thresh_hi})"
            )
        # torchvision's Matcher insists on low <= high; TF allows bg_thresh_hi > fg_thresh
        # (foreground wins where the two ranges overlap), so the real bound is kept apart.
        super().__init__(fg_thresh, min(bg_thresh_hi, fg_thresh), allow_low_quality_matches=False)
        self.bg_thresh_hi = float(bg_thresh_hi)
        self.bg_thresh_lo = float(bg_thresh_lo)

    def __call__(self, match_quality_matrix: Tensor) -> Tensor:
        """``match_quality_matrix``: ``[..., G, P]`` IoUs (G >= 1; a padding row's -1
        matches nothing). Returns ``[..., P]`` int64."""
        if match_quality_matrix.numel() == 0:
            raise ValueError("RangeMatcher needs at least one ground-truth box and one proposal")
        matched_vals, matches = match_quality_matrix.max(dim=-2)
        is_fg = matched_vals >= self.high_threshold
        is_bg = (matched_vals >= self.bg_thresh_lo) & (matched_vals < self.bg_thresh_hi) & ~is_fg
        out = torch.full_like(matches, self.BETWEEN_THRESHOLDS)
        out = torch.where(is_bg, torch.full_like(matches, self.BELOW_LOW_THRESHOLD), out)
        return torch.where(is_fg, matches, out)


def project_masks_via_gt_crops(
    gt_masks: Tensor,
    gt_boxes: Tensor,
    boxes: Tensor,
    matched_idxs: Tensor,
    *,
    gt_mask_size: int,
    resolution: int,
    mask_origins: Tensor | None = None,
) -> Tensor:
    """Mask targets for positive proposals, through a ``gt_mask_size`` crop of each GT.

    Both resamplings are RoIAlign with ``aligned=True`` (pixel ``i`` covers ``[i, i+1)``),
    so a proposal equal to its GT box gets the GT box's content, edges included.

    Args:
        gt_masks: ``[G, H, W]`` uint8/bool/float instance masks in the input frame, or
            with ``mask_origins`` compact masks (:mod:`maskops.mask_crops`): each cropped
            to its box, ``[G, h, w]``; the targets are the same either way.
        gt_boxes: ``[G, 4]`` xyxy ground-truth boxes, input pixels.
        boxes: ``[P, 4]`` xyxy proposals, input pixels.
        matched_idxs: ``[P]`` int64, the ground truth each proposal is matched to.
        gt_mask_size: side of the intermediate per-instance crop.
        resolution: ``M``, side of the returned targets.
        mask_origins: ``[G, 2]`` float ``(x, y)`` of each compact mask's top left pixel in
            the input frame; None for full-frame masks.

    Returns:
        ``[P, M, M]`` float targets in 0..1, in ``boxes``' dtype.
    """
    dtype = boxes.dtype if boxes.is_floating_point() else torch.float32
    if boxes.shape[0] == 0:
        return boxes.new_zeros((0, resolution, resolution), dtype=dtype)
    # Every GT is cropped, matched or not: picking the matched ones first (torch.unique)
    # made the host wait for the device once per image, and each crop depends on its own
    # GT alone, so the targets are the same.
    crops = crop_gt_masks(
        gt_masks, gt_boxes, gt_mask_size=gt_mask_size, dtype=dtype, mask_origins=mask_origins
    )
    return targets_from_crops(
        crops, gt_boxes, boxes, matched_idxs, gt_mask_size=gt_mask_size, resolution=resolution
    )


def crop_gt_masks(
    gt_masks: Tensor,
    gt_boxes: Tensor,
    *,
    gt_mask_size: int,
    dtype: torch.dtype,
    mask_origins: Tensor | None = None,
) -> Tensor:
    """Each ground-truth mask cut to its box and resampled to ``gt_mask_size`` squared
    (RoIAlign, ``aligned=True``), with a zero border of one pixel.

    Args: as :func:`project_masks_via_gt_crops`'s.

    Returns:
        ``[G, 1, gt_mask_size + 2, gt_mask_size + 2]`` in ``dtype``.
    """
    masks = gt_masks[:, None].to(dtype)
    gt_boxes = gt_boxes.to(dtype)
    index = torch.arange(gt_boxes.shape[0], device=gt_boxes.device, dtype=dtype)[:, None]
    in_masks = gt_boxes
    if mask_origins is not None:  # the gt box in its crop's pixels
        in_masks = gt_boxes - mask_origins.to(dtype).repeat(1, 2)
    crops = roi_align(
        masks, torch.cat([index, in_masks], dim=1), (gt_mask_size, gt_mask_size), 1.0, -1, True
    )
    # A zero border: roi_align clamps samples within one pixel outside its input to the edge
    # value, which would smear the GT box's border into proposals that are larger than it.
    return F.pad(crops, (1, 1, 1, 1))


def targets_from_crops(
    crops: Tensor,
    gt_boxes: Tensor,
    boxes: Tensor,
    matched_idxs: Tensor,
    *,
    gt_mask_size: int,
    resolution: int,
) -> Tensor:
    """Each proposal's ``M x M`` target cut from its matched ground truth's crop.

    Args:
        crops: ``[G, 1, gt_mask_size + 2, gt_mask_size + 2]`` (:func:`crop_gt_masks`).
        gt_boxes: ``[G, 4]``; ``boxes``: ``[P, 4]``; ``matched_idxs``: ``[P]`` into ``G``.

    Returns:
        ``[P, M, M]`` in the crops' dtype.
    """
    dtype = crops.dtype
    gt = gt_boxes.to(dtype)[matched_idxs]
    widths = (gt[:, 2] - gt[:, 0]).clamp(min=1e-6)
    heights = (gt[:, 3] - gt[:, 1]).clamp(min=1e-6)
    x1 = (boxes[:, 0].to(dtype) - gt[:, 0]) * gt_mask_size / widths + 1
    y1 = (boxes[:, 1].to(dtype) - gt[:, 1]) * gt_mask_size / heights + 1
    x2 = (boxes[:, 2].to(dtype) - gt[:, 0]) * gt_mask_size / widths + 1
    y2 = (boxes[:, 3].to(dtype) - gt[:, 1]) * gt_mask_size / heights + 1
    rois = torch.stack([matched_idxs.to(dtype), x1, y1, x2, y2], dim=1)
    return roi_align(crops, rois, (resolution, resolution), 1.0, -1, True)[:, 0]


def mask_loss(mask_logits: Tensor, mask_targets: Tensor, labels: Tensor) -> Tensor:
    """Binary cross-entropy of each RoI's mask for its ground-truth class.

    Args:
        mask_logits: ``[P, num_classes, M, M]``.
        mask_targets: ``[P, M, M]`` in 0..1.
        labels: ``[P]`` int64 class of each RoI.
    """
    if mask_targets.numel() == 0:
        return mask_logits.sum() * 0
    picked = mask_logits[torch.arange(labels.shape[0], device=labels.device), labels]
    return F.binary_cross_entropy_with_logits(picked, mask_targets.to(picked.dtype))


def sampled_fastrcnn_loss(
    class_logits: Tensor, box_regression: Tensor, labels: Tensor, regression_targets: Tensor
) -> tuple[Tensor, Tensor]:
    """torchvision's ``fastrcnn_loss`` over the filled sampling slots.

    Args:
        class_logits: ``[N, K]``.
        box_regression: ``[N, 4K]``.
        labels: ``[N]`` int64 class per slot; :data:`EMPTY_SLOT` for an empty one.
        regression_targets: ``[N, 4]``.

    Returns:
        ``(classification_loss, box_loss)``: the mean cross-entropy over the filled slots,
        and the smooth-L1 (beta 1/9) sum over the positives divided by the filled slots.
    """
    classification_loss = F.cross_entropy(class_logits, labels, ignore_index=EMPTY_SLOT)
    rows = torch.arange(labels.shape[0], device=labels.device)
    picked = box_regression.reshape(labels.shape[0], -1, 4)[rows, labels.clamp(min=0)]
    per_slot = F.smooth_l1_loss(picked, regression_targets, beta=1 / 9, reduction="none")
    box_loss = torch.where(labels > 0, per_slot.sum(dim=1), 0.0).sum()
    return classification_loss, box_loss / (labels >= 0).sum().clamp(min=1)


@dataclass(frozen=True)
class Samples:
    """A batch's sampled proposals, ``S`` slots per image (``B`` images)."""

    proposals: Tensor
    """``[B, S, 4]`` xyxy."""
    matched: Tensor
    """``[B, S]`` int64: the index of each one's ground truth among its image's."""
    labels: Tensor
    """``[B, S]`` int64: class, 0 background, :data:`EMPTY_SLOT`."""
    regression_targets: Tensor
    """``[B, S, 4]``."""
    gt_counts: Tensor
    """``[B]`` int64: each image's ground truths (on the device, made without a copy)."""


class SpecRoIHeads(RoIHeads):
    """Box (and optionally mask) heads; see the module docstring for what differs."""

    def __init__(
        self,
        *,
        box_roi_pool: nn.Module,
        box_head: nn.Module,
        box_predictor: nn.Module,
        fg_thresh: float,
        bg_thresh_hi: float,
        bg_thresh_lo: float,
        batch_size_per_image: int,
        positive_fraction: float,
        bbox_reg_weights: tuple[float, float, float, float],
        score_thresh: float,
        nms_thresh: float,
        detections_per_img: int,
        gt_mask_size: int,
        mask_roi_pool: nn.Module | None = None,
        mask_head: nn.Module | None = None,
        mask_predictor: nn.Module | None = None,
    ) -> None:
        super().__init__(
            box_roi_pool,
            box_head,
            box_predictor,
            fg_thresh,
            bg_thresh_hi,
            batch_size_per_image,
            positive_fraction,
            bbox_reg_weights,
            score_thresh,
            nms_thresh,
            detections_per_img,
            mask_roi_pool=mask_roi_pool,
            mask_head=mask_head,
            mask_predictor=mask_predictor,
        )
        self.box_coder = HostScalarBoxCoder(bbox_reg_weights)
        self.proposal_matcher = RangeMatcher(
            fg_thresh=fg_thresh, bg_thresh_hi=bg_thresh_hi, bg_thresh_lo=bg_thresh_lo
        )
        self.fg_bg_sampler = SyncFreeSampler(batch_size_per_image, positive_fraction)
        self.gt_mask_size = int(gt_mask_size)

    def assign_targets_to_proposals(
        self, proposals: list[Tensor], gt_boxes: list[Tensor], gt_labels: list[Tensor]
    ) -> tuple[list[Tensor], list[Tensor]]:
        """torchvision's proposal labels (class, 0 background, -1 ignored) and matched
        ground-truth indices, ``[P_i]`` each per image (:meth:`_assign_padded` per batch)."""
        candidates, valid = pad_boxes(proposals)
        matched, labels = self._assign_padded(
            candidates, valid, *pad_boxes(gt_boxes), pad_sequence(gt_labels, batch_first=True)
        )
        lengths = [p.shape[0] for p in proposals]
        return unpad(matched, lengths), unpad(labels, lengths)

    def _assign_padded(
        self,
        candidates: Tensor,
        candidate_valid: Tensor,
        gt_boxes: Tensor,
        gt_valid: Tensor,
        gt_labels: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Labels and matched ground truths of a padded batch of proposals.

        Args:
            candidates: ``[B, N, 4]`` proposals, padded; ``candidate_valid``: ``[B, N]``.
            gt_boxes: ``[B, G, 4]`` ground truths, padded; ``gt_valid``: ``[B, G]``.
            gt_labels: ``[B, G]`` int64.

        Returns:
            ``([B, N] matched index, [B, N] label)``: the index 0 and label 0 (background)
            for every proposal of an image without ground truth, as torchvision does, and
            the label -1 (never sampled) for padding.
        """
        num_images, num_candidates = candidate_valid.shape
        if gt_boxes.shape[1] == 0:  # only background images
            matched = candidate_valid.new_zeros((num_images, num_candidates), dtype=torch.int64)
            return matched, torch.where(candidate_valid, matched, -1)
        overlaps = torch.where(
            gt_valid[..., None], box_iou_batched(gt_boxes, candidates), -1.0
        )  # [B, G, N]
        matches = self.proposal_matcher(overlaps)
        has_gt = gt_valid.any(dim=1, keepdim=True)
        matched = torch.where(has_gt, matches.clamp(min=0), 0)
        label = gt_labels.gather(1, matched).to(torch.int64)
        label = torch.where(matches == self.proposal_matcher.BELOW_LOW_THRESHOLD, 0, label)
        label = torch.where(matches == self.proposal_matcher.BETWEEN_THRESHOLDS, -1, label)
        label = torch.where(has_gt, label, 0)
        return matched, torch.where(candidate_valid, label, -1)

    def select_training_samples(
        self, proposals: list[Tensor], targets: list[dict[str, Tensor]] | None
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
        """The sampled proposals of each image, in ``min(batch_size_per_image, N)`` slots,
        ``N`` the most proposals (ground truths added) of an image of the batch.

        Args:
            proposals: per image ``[P_i, 4]`` xyxy; the ground-truth boxes are added.
            targets: per image ``boxes`` ``[G_i, 4]`` and ``labels`` ``[G_i]``.

        Returns:
            Per image: the slots' proposals ``[S, 4]``, matched ground-truth indices
            ``[S]``, labels ``[S]`` (:data:`EMPTY_SLOT` where nothing was sampled) and
            regression targets ``[S, 4]``.
        """
        self.check_targets(targets)
        assert targets is not None
        samples = self._sample(proposals, targets)
        return (
            list(samples.proposals.unbind()),
            list(samples.matched.unbind()),
            list(samples.labels.unbind()),
            list(samples.regression_targets.unbind()),
        )

    def _sample(self, proposals: list[Tensor], targets: list[dict[str, Tensor]]) -> Samples:
        """:meth:`select_training_samples` for all images at once: see :class:`Samples`."""
        gt_per_image = [t["boxes"].to(proposals[0].dtype) for t in targets]
        gt_boxes, gt_valid = pad_boxes(gt_per_image)
        # torchvision's rows: each image's proposals, then its ground truths.
        candidates, valid = pad_boxes(self.add_gt_proposals(proposals, gt_per_image))
        gt_labels = pad_sequence([t["labels"] for t in targets], batch_first=True)
        matched, labels = self._assign_padded(candidates, valid, gt_boxes, gt_valid, gt_labels)
        positives, negatives = self.fg_bg_sampler(list(labels.unbind()))
        sampled = torch.stack(positives).bool() | torch.stack(negatives).bool()  # [B, N]
        slots = first_true(sampled, min(self.fg_bg_sampler.batch_size_per_image, labels.shape[1]))
        rows = torch.arange(len(targets), device=slots.device)[:, None]
        sampled_matches = matched[rows, slots]
        sampled_proposals = candidates[rows, slots]
        if gt_boxes.shape[1] == 0:  # only background images: nothing to regress to
            gt_boxes = gt_boxes.new_zeros((len(targets), 1, 4))
        regression_targets = self.box_coder.encode_single(
            gt_boxes[rows, sampled_matches].flatten(0, 1), sampled_proposals.flatten(0, 1)
        ).view_as(sampled_proposals)
        return Samples(
            proposals=sampled_proposals,
            matched=sampled_matches,
            labels=torch.where(sampled[rows, slots], labels[rows, slots], EMPTY_SLOT),
            regression_targets=regression_targets,
            gt_counts=gt_valid.sum(dim=1),
        )

    def _mask_loss(
        self,
        features: dict[str, Tensor],
        image_shapes: list[tuple[int, int]],
        samples: Samples,
        targets: list[dict[str, Tensor]],
    ) -> Tensor:
        """The mask loss of the sampled positives, their targets made for the batch at once
        after one read of the device (how many positives each image has)."""
        positive = samples.labels > 0  # [B, S]
        counts = positive.sum(dim=1).tolist()  # the one read of the mask branch
        chosen = first_true(positive.flatten(), sum(counts))  # slots, image by image
        proposals = samples.proposals.flatten(0, 1)[chosen]
        mask_logits = self._mask_logits(features, list(proposals.split(counts)), image_shapes)
        # Each positive's ground truth among the batch's (the images' ground truths in turn).
        first_gt = samples.gt_counts.cumsum(0) - samples.gt_counts
        gt_index = samples.matched.flatten()[chosen] + first_gt[chosen // positive.shape[1]]
        dtype = proposals.dtype if proposals.is_floating_point() else torch.float32
        crops = [
            crop_gt_masks(
                t["masks"],
                t["boxes"],
                gt_mask_size=self.gt_mask_size,
                dtype=dtype,
                mask_origins=t.get(MASK_ORIGINS),
            )
            for t in targets
            if t["boxes"].shape[0]
        ]
        if not crops or proposals.shape[0] == 0:
            mask_targets = proposals.new_zeros((0, *mask_logits.shape[-2:]), dtype=dtype)
        else:
            mask_targets = targets_from_crops(
                torch.cat(crops),
                torch.cat([t["boxes"] for t in targets]),
                proposals,
                gt_index,
                gt_mask_size=self.gt_mask_size,
                resolution=mask_logits.shape[-1],
            )
        labels = torch.cat([t["labels"] for t in targets])[gt_index]
        return mask_loss(mask_logits, mask_targets, labels)

    def _mask_logits(
        self, features: dict[str, Tensor], boxes: list[Tensor], image_shapes: list[tuple[int, int]]
    ) -> Tensor:
        assert self.mask_roi_pool is not None
        assert self.mask_head is not None
        assert self.mask_predictor is not None
        pooled = self.mask_roi_pool(features, boxes, image_shapes)
        logits: Tensor = self.mask_predictor(self.mask_head(pooled))
        return logits

    def forward(
        self,
        features: dict[str, Tensor],
        proposals: list[Tensor],
        image_shapes: list[tuple[int, int]],
        targets: list[dict[str, Tensor]] | None = None,
    ) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        """Args:
            features: FPN maps ``{"p{l}": [B, C, H_l, W_l]}``.
            proposals: per image ``[P_i, 4]`` xyxy proposals, input pixels.
            image_shapes: per image unpadded ``(H, W)``.
            targets: training only: per image ``boxes`` ``[N, 4]`` xyxy float, ``labels``
                ``[N]`` int64, and ``masks`` ``[N, H, W]`` uint8 when the mask branch exists
                (or compact masks with their ``mask_origins``: :mod:`maskops.mask_crops`).

        Returns:
            Training: ``([], losses)``. Eval: per image ``boxes`` ``[D, 4]`` xyxy (input
            frame), ``labels`` ``[D]`` int64, ``scores`` ``[D]`` and, with a mask branch,
            ``masks`` ``[D, 1, M, M]`` probabilities; and ``{}``.
        """
        if not self.training:
            return self._detect(features, proposals, image_shapes), {}
        if targets is None:
            raise ValueError("targets are required in training mode")
        self.check_targets(targets)
        for i, t in enumerate(targets):
            if not t["boxes"].is_floating_point():
                raise TypeError(f"target {i}: boxes must be float, got {t['boxes'].dtype}")
            if t["labels"].dtype != torch.int64:
                raise TypeError(f"target {i}: labels must be int64, got {t['labels'].dtype}")

        samples = self._sample(proposals, targets)
        sampled_proposals = list(samples.proposals.unbind())
        box_features = self.box_head(self.box_roi_pool(features, sampled_proposals, image_shapes))
        class_logits, box_regression = self.box_predictor(box_features)
        loss_classifier, loss_box_reg = sampled_fastrcnn_loss(
            class_logits,
            box_regression,
            samples.labels.flatten(),
            samples.regression_targets.flatten(0, 1),
        )
        losses = {"loss_classifier": loss_classifier, "loss_box_reg": loss_box_reg}
        if self.has_mask():
            losses["loss_mask"] = self._mask_loss(features, image_shapes, samples, targets)
        return [], losses

    def postprocess_detections(
        self,
        class_logits: Tensor,
        box_regression: Tensor,
        proposals: list[Tensor],
        image_shapes: list[tuple[int, int]],
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """torchvision's detections; on a GPU by :meth:`detections_with_few_reads`. On a
        CPU, and when traced for export, torchvision's own code (a trace must not freeze
        the tracing example's counts, and a CPU's detections stay the exported graph's)."""
        if not class_logits.is_cuda or torch.jit.is_tracing() or torch.jit.is_scripting():
            return super().postprocess_detections(
                class_logits, box_regression, proposals, image_shapes
            )
        return self.detections_with_few_reads(class_logits, box_regression, proposals, image_shapes)

    def detections_with_few_reads(
        self,
        class_logits: Tensor,
        box_regression: Tensor,
        proposals: list[Tensor],
        image_shapes: list[tuple[int, int]],
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """torchvision's ``postprocess_detections`` with one read for the batch of how many
        class boxes pass the score and size rules (torchvision reads twice per image), then
        NMS per class (:func:`.nms.nms_by_group`: one call per image on a GPU).

        Args:
            class_logits: ``[R, K]`` for the ``R`` proposals of all images.
            box_regression: ``[R, 4K]``.
            proposals: per image ``[P_i, 4]`` xyxy.
            image_shapes: per image ``(H, W)``.

        Returns:
            Per image boxes ``[D_i, 4]``, scores ``[D_i]`` and labels ``[D_i]`` int64, by
            decreasing score, at most ``detections_per_img``.
        """
        num_classes = class_logits.shape[-1]
        per_image = [p.shape[0] for p in proposals]
        decoded = self.box_coder.decode(box_regression, proposals).split(per_image)
        probabilities = F.softmax(class_logits, -1).split(per_image)
        candidates = []
        for boxes, scores, shape in zip(decoded, probabilities, image_shapes, strict=True):
            # Every class box but the background's, class-major within each proposal.
            boxes = box_ops.clip_boxes_to_image(boxes, shape)[:, 1:].reshape(-1, 4)
            labels = torch.arange(1, num_classes, device=boxes.device).repeat(scores.shape[0])
            scores = scores[:, 1:].reshape(-1)
            sizes = boxes[:, 2:] - boxes[:, :2]
            passing = (scores > self.score_thresh) & (sizes >= 1e-2).all(dim=1)
            candidates.append((boxes, scores, labels, passing))
        passing_indices = true_indices([passing for *_, passing in candidates])
        all_boxes, all_scores, all_labels = [], [], []
        for (boxes, scores, labels, _), index in zip(candidates, passing_indices, strict=True):
            boxes, scores, labels = boxes[index], scores[index], labels[index]
            keep = nms_by_group(boxes, scores, labels, self.nms_thresh)[: self.detections_per_img]
            all_boxes.append(boxes[keep])
            all_scores.append(scores[keep])
            all_labels.append(labels[keep])
        return all_boxes, all_scores, all_labels

    def _detect(
        self,
        features: dict[str, Tensor],
        proposals: list[Tensor],
        image_shapes: list[tuple[int, int]],
    ) -> list[dict[str, Tensor]]:
        box_features = self.box_head(self.box_roi_pool(features, proposals, image_shapes))
        class_logits, box_regression = self.box_predictor(box_features)
        boxes, scores, labels = self.postprocess_detections(
            class_logits, box_regression, proposals, image_shapes
        )
        result = [
            {"boxes": b, "labels": lbl, "scores": s}
            for b, lbl, s in zip(boxes, labels, scores, strict=True)
        ]
        if self.has_mask():
            mask_logits = self._mask_logits(features, boxes, image_shapes)
            for r, probs in zip(result, maskrcnn_inference(mask_logits, labels), strict=True):
                r["masks"] = probs
        return result
