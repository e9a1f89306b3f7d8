"""torchvision's prediction heads with float32 outputs and TF's predictor initialisation.

Under autocast the heads' convolutions and linears run in bf16/fp16, and torchvision then
decodes boxes in the dtype of the predicted deltas. bf16 keeps 8 significant bits, so an
anchor at x = 800 would move in 4-pixel steps. Casting the (small) head outputs to float32
keeps box decoding, NMS, losses and mask probabilities in float32 while the expensive
layers stay in low precision. Parameter names are unchanged, so torchvision weights load.

Initialisation: torchvision initialises the mask logits layer with Kaiming "fan_out",
whose fan-out is the number of classes: with a handful of classes the initial mask logits
have a standard deviation around 10 and the mask loss starts near 8 (a from-scratch run
at lr 0.01 without warmup diverged within five steps). The predictors here start as TF
Mask R-CNN's box head does (class logits N(0, 0.01), box deltas N(0, 0.001)) and the mask
logits as Detectron's (N(0, 0.001)), all with zero biases, so every loss starts at its
uninformed value.
"""

from __future__ import annotations

from torch import Tensor, nn
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNPredictor
from torchvision.models.detection.rpn import RPNHead


def _normal_init(layer: nn.Module, *, std: float) -> None:
    assert isinstance(layer, nn.Linear | nn.Conv2d)
    nn.init.normal_(layer.weight, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


class Float32RPNHead(RPNHead):
    """``RPNHead``: per level objectness ``[B, A, H, W]`` and deltas ``[B, 4A, H, W]``, fp32."""

    def forward(self, x: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        logits, deltas = super().forward(x)
        return [t.float() for t in logits], [t.float() for t in deltas]


class Float32FastRCNNPredictor(FastRCNNPredictor):
    """``FastRCNNPredictor``: class logits ``[R, K]`` and deltas ``[R, 4K]``, fp32."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__(in_channels, num_classes)
        _normal_init(self.cls_score, std=0.01)
        _normal_init(self.bbox_pred, std=0.001)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        scores, deltas = super().forward(x)
        return scores.float(), deltas.float()


class Float32MaskRCNNPredictor(MaskRCNNPredictor):
    """``MaskRCNNPredictor``: mask logits ``[R, K, M, M]``, fp32."""

    def __init__(self, in_channels: int, dim_reduced: int, num_classes: int) -> None:
        super().__init__(in_channels, dim_reduced, num_classes)
        _normal_init(self.mask_fcn_logits, std=0.001)

    def forward(self, input: Tensor) -> Tensor:
        out: Tensor = super().forward(input)
        return out.float()
