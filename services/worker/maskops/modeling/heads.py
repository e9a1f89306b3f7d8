"""torchvision's prediction heads with float32 outputs.

Under autocast the heads' convolutions and linears run in bf16/fp16, and torchvision then
decodes boxes in the dtype of the predicted deltas. bf16 keeps 8 significant bits, so an
anchor at x = 800 would move in 4-pixel steps. Casting the (small) head outputs to float32
keeps box decoding, NMS, losses and mask probabilities in float32 while the expensive
layers stay in low precision. Parameter names are unchanged, so torchvision weights load.
"""

from __future__ import annotations

from torch import Tensor
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNPredictor
from torchvision.models.detection.rpn import RPNHead


class Float32RPNHead(RPNHead):
    """``RPNHead``: per level objectness ``[B, A, H, W]`` and deltas ``[B, 4A, H, W]``, fp32."""

    def forward(self, x: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        logits, deltas = super().forward(x)
        return [t.float() for t in logits], [t.float() for t in deltas]


class Float32FastRCNNPredictor(FastRCNNPredictor):
    """``FastRCNNPredictor``: class logits ``[R, K]`` and deltas ``[R, 4K]``, fp32."""

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        scores, deltas = super().forward(x)
        return scores.float(), deltas.float()


class Float32MaskRCNNPredictor(MaskRCNNPredictor):
    """``MaskRCNNPredictor``: mask logits ``[R, K, M, M]``, fp32."""

    def forward(self, input: Tensor) -> Tensor:
        out: Tensor = super().forward(input)
        return out.float()
