"""torchvision's RegionProposalNetwork with separate train/test NMS thresholds.

TAO has ``train_rpn_nms_threshold`` and ``test_rpn_nms_thresh``; torchvision has one
``nms_thresh``. Everything else (per-level pre-NMS top-n, post-NMS top-n per image, the
anchor matcher and the balanced sampler) is torchvision's, fed from the spec.
"""

from __future__ import annotations

from torch import nn
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.rpn import RegionProposalNetwork

MIN_PROPOSAL_SIZE = 1e-3
"""Floor for rpn_min_size: a zero-width proposal would give infinite box-regression
targets in the RoI head (log of 0), so rpn_min_size 0 means torchvision's 1e-3 px."""


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

    @property
    def nms_thresh(self) -> float:
        return self._nms_thresh["training" if self.training else "testing"]

    @nms_thresh.setter
    def nms_thresh(self, value: float) -> None:
        """Assigning one threshold (as torchvision's ``__init__`` does) sets both modes."""
        self._nms_thresh = {"training": value, "testing": value}
