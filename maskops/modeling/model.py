"""The typed Mask R-CNN builder: every ``MaskRCNNConfig`` field wired into torchvision parts.

Where each field goes:

=========================================  ================================================
nlayers, freeze_bn, freeze_blocks,         ``model.backbone`` (:mod:`.backbone`)
min_level, max_level
anchor_scale, num_scales, aspect_ratios    ``model.rpn.anchor_generator`` (:mod:`.anchors`)
rpn_positive/negative_overlap              ``model.rpn.proposal_matcher`` thresholds
rpn_batch_size_per_im, rpn_fg_fraction     ``model.rpn.fg_bg_sampler``
rpn_min_size                               ``model.rpn.min_size``
train/test_rpn_pre_nms_topn (per level),   ``model.rpn._pre_nms_top_n`` / ``_post_nms_top_n``
train/test_rpn_post_nms_topn
train_rpn_nms_threshold,                   ``model.rpn.nms_thresh`` (by train/eval mode)
test_rpn_nms_thresh
fg_thresh, bg_thresh_hi, bg_thresh_lo      ``model.roi_heads.proposal_matcher``
batch_size_per_im, fg_fraction             ``model.roi_heads.fg_bg_sampler``
bbox_reg_weights                           ``model.roi_heads.box_coder.weights``
fast_rcnn_mlp_head_dim                     ``model.roi_heads.box_head`` (TwoMLPHead width)
test_detections_per_image, test_nms        ``model.roi_heads.detections_per_img`` / ``nms_thresh``
include_mask                               mask branch present or not
mrcnn_resolution                           mask output ``M`` (mask RoIAlign at ``M / 2``)
gt_mask_size                               ``model.roi_heads.gt_mask_size``
rpn_box_loss_weight,                       ``model.loss_weights`` scaling ``loss_rpn_box_reg``,
fast_rcnn_box_loss_weight,                 ``loss_box_reg`` and ``loss_mask``
mrcnn_weight_loss_mask
=========================================  ================================================

``arch`` must be "resnet". RoIs are pooled from the levels the ResNet stages produce
(``min_level..min(max_level, 5)``), as torchvision does; the max-pool levels above 5 feed
the RPN only.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torchvision.models.detection.faster_rcnn import TwoMLPHead
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from torchvision.models.detection.mask_rcnn import MaskRCNN, MaskRCNNHeads

from maskops.shape_rules import image_size_fits, image_stride
from maskops.spec.models import MaskRCNNConfig

from .anchors import LevelAnchorGenerator
from .backbone import BACKBONE_LEVELS, FPN_CHANNELS, build_resnet_fpn_backbone
from .heads import Float32FastRCNNPredictor, Float32MaskRCNNPredictor, Float32RPNHead
from .poolers import GatherMultiScaleRoIAlign
from .roi_heads import SpecRoIHeads
from .rpn import TrainTestRPN
from .transform import NoResizeTransform

BOX_SCORE_THRESH = 0.05
"""Detections scoring below this are dropped before NMS (torchvision's default)."""

BOX_ROI_SIZE = 7
MASK_HEAD_LAYERS = (256, 256, 256, 256)
MASK_PREDICTOR_DIM = 256

PRUNABLE_LAYER_PREFIXES = ("backbone.", "rpn.head.conv.")
"""Module-name prefixes of the convs whose filters structured pruning may remove: the ResNet
body and FPN, and the RPN head's shared conv. The RoI heads keep their widths."""
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""The ``torch.compile`` modes :meth:`SpecMaskRCNN.compile_backbone` takes
(``reduce-overhead`` replays the compiled code as CUDA graphs on a GPU)."""


def prunable_convs(model: nn.Module) -> dict[str, nn.Conv2d]:
    """A built model's prunable convs by module name (:data:`PRUNABLE_LAYER_PREFIXES`)."""
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.Conv2d) and name.startswith(PRUNABLE_LAYER_PREFIXES)
    }


LOSS_NAMES = {
    "loss_objectness": "RPN score loss",
    "loss_rpn_box_reg": "RPN box loss",
    "loss_classifier": "FastRCNN class loss",
    "loss_box_reg": "FastRCNN box loss",
    "loss_mask": "Mask loss",
}
"""Loss keys the model returns in training mode -> TAO's names for them."""


class SpecMaskRCNN(MaskRCNN):
    """A torchvision ``MaskRCNN`` assembled from spec-driven parts (see :func:`build_model`).

    Differences from torchvision's ``MaskRCNN`` in use:

    * inputs are float ``[3, H, W]`` images in 0..1 already resized and padded; the model
      normalises and batches but never resizes;
    * eval outputs keep boxes in the input frame and masks as ``[N, 1, M, M]``
      probabilities of the box region (not pasted);
    * training losses are multiplied by ``loss_weights`` (the spec's loss weights).
    """

    def __init__(
        self,
        *,
        backbone: torch.nn.Module,
        rpn: TrainTestRPN,
        roi_heads: SpecRoIHeads,
        transform: NoResizeTransform,
        loss_weights: Mapping[str, float],
        num_classes: int,
        image_size: tuple[int, int],
        config: MaskRCNNConfig,
    ) -> None:
        # MaskRCNN/FasterRCNN.__init__ only assemble default parts from keyword arguments;
        # every part here is built from the spec already, so go straight to the base class.
        GeneralizedRCNN.__init__(self, backbone, rpn, roi_heads, transform)
        self.loss_weights = dict(loss_weights)
        self.num_classes = num_classes
        self.image_size = image_size
        self.config = config.model_copy(deep=True)

    def forward(
        self,
        images: list[Tensor],
        targets: list[dict[str, Tensor]] | None = None,
    ) -> dict[str, Tensor] | list[dict[str, Tensor]]:
        """Training (with ``targets``): the weighted loss dict (keys in ``LOSS_NAMES``).
        Eval: per image ``boxes`` [N, 4] xyxy float (input frame), ``labels`` [N] int64
        (contiguous training labels), ``scores`` [N], and ``masks`` [N, 1, M, M] float
        mask probabilities of each box region when the mask branch exists.
        """
        if not self.training:
            return super().forward(images, targets)
        if targets is None:
            raise ValueError("targets are required in training mode")
        losses = self._training_losses(images, targets)
        return {key: loss * self.loss_weights.get(key, 1.0) for key, loss in losses.items()}

    def _training_losses(
        self, images: list[Tensor], targets: list[dict[str, Tensor]]
    ) -> dict[str, Tensor]:
        """torchvision's ``GeneralizedRCNN.forward`` in training, its target checks made
        without a read of the device of their own: the boxes' shapes here, their sizes by
        the RPN with the read it makes anyway (:meth:`TrainTestRPN.forward`)."""
        check_target_boxes(targets)
        image_list, transformed = self.transform(images, targets)
        assert transformed is not None
        features = self.backbone(image_list.tensors)
        proposals, proposal_losses = self.rpn(image_list, features, transformed)
        _, detector_losses = self.roi_heads(
            features, proposals, image_list.image_sizes, transformed
        )
        return {**detector_losses, **proposal_losses}

    @torch.no_grad()
    def validation_losses(
        self, images: list[Tensor], targets: list[dict[str, Tensor]]
    ) -> dict[str, Tensor]:
        """The weighted training losses on held-out data, changing nothing in the model.

        Losses exist only in training mode, where BatchNorm2d would update its running
        statistics from validation data; here batch norm runs in eval mode and every
        module's mode is restored afterwards. Anchor/proposal sampling draws from the
        global torch RNG, as in training.
        """
        modes = {module: module.training for module in self.modules()}
        try:
            self.train()
            for module in self.modules():
                if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                    module.eval()
            losses = self(images, targets)
        finally:
            for module, mode in modes.items():
                module.training = mode
        assert isinstance(losses, dict)
        return losses

    def to_channels_last(self) -> SpecMaskRCNN:
        """Convert weights and batched inputs to channels_last (faster convs on CPU/AMP)."""
        self.to(memory_format=torch.channels_last)
        assert isinstance(self.transform, NoResizeTransform)
        self.transform.memory_format = torch.channels_last
        return self

    def compile_backbone(self, mode: str) -> SpecMaskRCNN:
        """Compile the backbone and FPN in place with ``torch.compile`` in ``mode`` (one of
        :data:`COMPILE_MODES`) for one input shape (``dynamic=False``: every training batch
        is ``[B, 3, *image_size]``; an evaluation's batch size or the eval-mode batch norm
        compiles once more).

        In place (``nn.Module.compile``), so parameter names, checkpoints and the optimizer
        see the same module; the first step pays the compilation.

        Raises:
            ValueError: ``mode`` is not a compile mode.
        """
        if mode not in COMPILE_MODES:
            raise ValueError(f"{mode!r} is not a torch.compile mode ({', '.join(COMPILE_MODES)})")
        self.backbone.compile(mode=mode, dynamic=False)
        return self


def check_target_boxes(targets: list[dict[str, Tensor]]) -> None:
    """Fail on a target whose ``boxes`` is not ``[N, 4]`` (torchvision's check), naming the
    image. Shapes only, known on the host: that every box has a positive width and height
    is checked by the RPN (:meth:`.rpn.TrainTestRPN.forward`), in a read it makes anyway.

    Raises:
        ValueError: the first such target.
    """
    for index, target in enumerate(targets):
        boxes = target["boxes"]
        if not isinstance(boxes, Tensor) or boxes.dim() != 2 or boxes.shape[-1] != 4:
            shape = tuple(boxes.shape) if isinstance(boxes, Tensor) else type(boxes).__name__
            raise ValueError(f"target {index}: boxes must be a [N, 4] tensor, got {shape}")


def build_model(
    config: MaskRCNNConfig, *, num_classes: int, image_size: tuple[int, int]
) -> SpecMaskRCNN:
    """Build a randomly initialised Mask R-CNN from the spec's ``maskrcnn_config``.

    Args:
        config: the spec's ``maskrcnn_config``; every field is used (see module docstring).
        num_classes: model classes including background (label map's ``num_classes``).
        image_size: ``(H, W)`` the inputs are resized and padded to; both sides must be
            multiples of ``2**max_level``.

    Returns:
        A :class:`SpecMaskRCNN` in training mode.
    """
    _check_buildable(config, num_classes=num_classes, image_size=image_size)
    backbone = build_resnet_fpn_backbone(
        nlayers=config.nlayers,
        min_level=config.min_level,
        max_level=config.max_level,
        freeze_bn=config.freeze_bn,
        freeze_blocks=config.freeze_blocks,
    )
    levels = list(range(config.min_level, config.max_level + 1))
    transform = NoResizeTransform(
        size_divisible=image_stride(config.max_level),
        image_size=tuple(image_size),  # type: ignore[arg-type]
    )
    loss_weights = {
        "loss_rpn_box_reg": config.rpn_box_loss_weight,
        "loss_box_reg": config.fast_rcnn_box_loss_weight,
        "loss_mask": config.mrcnn_weight_loss_mask,
    }
    return SpecMaskRCNN(
        backbone=backbone,
        rpn=_build_rpn(config, levels),
        roi_heads=_build_roi_heads(config, levels, num_classes),
        transform=transform,
        loss_weights=loss_weights,
        num_classes=num_classes,
        image_size=(int(image_size[0]), int(image_size[1])),
        config=config,
    )


def _check_buildable(
    config: MaskRCNNConfig, *, num_classes: int, image_size: tuple[int, int]
) -> None:
    if config.arch != "resnet":
        raise ValueError(f"maskrcnn_config.arch: only 'resnet' is supported, got {config.arch!r}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2 (background + 1 category), got {num_classes}")
    if not image_size_fits(image_size, config.max_level):
        stride = image_stride(config.max_level)
        raise ValueError(
            f"image_size {tuple(image_size)} must be a multiple of 2**max_level = {stride}"
        )
    if config.mrcnn_resolution % 2:
        raise ValueError(f"mrcnn_resolution must be even, got {config.mrcnn_resolution}")


def _build_rpn(config: MaskRCNNConfig, levels: list[int]) -> TrainTestRPN:
    """The RPN over the FPN ``levels``, with the spec's training and testing settings."""
    anchor_generator = LevelAnchorGenerator(
        levels=levels,
        anchor_scale=config.anchor_scale,
        num_scales=config.num_scales,
        aspect_ratios=config.aspect_ratios,
    )
    return TrainTestRPN(
        anchor_generator=anchor_generator,
        head=Float32RPNHead(FPN_CHANNELS, anchor_generator.num_anchors_per_location()[0]),
        fg_iou_thresh=config.rpn_positive_overlap,
        bg_iou_thresh=config.rpn_negative_overlap,
        batch_size_per_image=config.rpn_batch_size_per_im,
        positive_fraction=config.rpn_fg_fraction,
        pre_nms_top_n={
            "training": config.train_rpn_pre_nms_topn,
            "testing": config.test_rpn_pre_nms_topn,
        },
        post_nms_top_n={
            "training": config.train_rpn_post_nms_topn,
            "testing": config.test_rpn_post_nms_topn,
        },
        nms_thresh={
            "training": config.train_rpn_nms_threshold,
            "testing": config.test_rpn_nms_thresh,
        },
        min_size=config.rpn_min_size,
    )


def _build_roi_heads(config: MaskRCNNConfig, levels: list[int], num_classes: int) -> SpecRoIHeads:
    """The box head and, with ``include_mask``, the mask head, pooling the FPN ``levels``
    the backbone has."""
    roi_levels = [f"p{lvl}" for lvl in levels if lvl <= BACKBONE_LEVELS[-1]]
    mask_parts: dict[str, torch.nn.Module] = {}
    if config.include_mask:
        mask_parts = {
            "mask_roi_pool": GatherMultiScaleRoIAlign(
                roi_levels, output_size=config.mrcnn_resolution // 2, sampling_ratio=2
            ),
            "mask_head": MaskRCNNHeads(FPN_CHANNELS, MASK_HEAD_LAYERS, 1),
            "mask_predictor": Float32MaskRCNNPredictor(
                MASK_HEAD_LAYERS[-1], MASK_PREDICTOR_DIM, num_classes
            ),
        }
    return SpecRoIHeads(
        box_roi_pool=GatherMultiScaleRoIAlign(
            roi_levels, output_size=BOX_ROI_SIZE, sampling_ratio=2
        ),
        box_head=TwoMLPHead(FPN_CHANNELS * BOX_ROI_SIZE**2, config.fast_rcnn_mlp_head_dim),
        box_predictor=Float32FastRCNNPredictor(config.fast_rcnn_mlp_head_dim, num_classes),
        fg_thresh=config.fg_thresh,
        bg_thresh_hi=config.bg_thresh_hi,
        bg_thresh_lo=config.bg_thresh_lo,
        batch_size_per_image=config.batch_size_per_im,
        positive_fraction=config.fg_fraction,
        bbox_reg_weights=config.bbox_reg_weights,
        score_thresh=BOX_SCORE_THRESH,
        nms_thresh=config.test_nms,
        detections_per_img=config.test_detections_per_image,
        gt_mask_size=config.gt_mask_size,
        **mask_parts,
    )
