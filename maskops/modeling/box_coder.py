"""torchvision's box coding without tensors made from Python numbers at each call.

torchvision's ``BoxCoder.encode_single`` makes its weights a tensor on the boxes' device
at every call (``torch.as_tensor(weights, device=...)``), and ``decode_single`` makes two
``torch.tensor(0.5, device=...)``: on a GPU each is a copy from pageable host memory that
the host waits for, four per training step between the RPN and the RoI heads.
:class:`HostScalarBoxCoder` multiplies by Python floats instead, which a kernel takes as
an argument.

The results are torchvision's to the bit. A Python float enters a float16 or bfloat16
operation at float32 precision, where torchvision's 0-dim weight tensor holds the weight
rounded to the boxes' dtype; so each weight is rounded to that dtype first
(:func:`values_in`), on the host, as ``torch.as_tensor`` rounds it. ``0.5`` is exact in
every floating dtype.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import torch
from torch import Tensor
from torchvision.models.detection._utils import BoxCoder


def values_in(values: Sequence[float], dtype: torch.dtype) -> tuple[float, ...]:
    """``values`` rounded to ``dtype`` as ``torch.as_tensor(values, dtype=dtype)`` rounds
    them, as Python floats: what a 0-dim tensor of each would hold.

    Computed on the host without a tensor for the floating dtypes a model runs in (float64,
    float32, float16, bfloat16): torch converts a Python float to float32 first (round to
    nearest even), then to float16 or bfloat16 (again to nearest even). Other dtypes go
    through ``torch.as_tensor`` on the CPU.
    """
    if dtype == torch.float64:
        return tuple(float(v) for v in values)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return tuple(float(v) for v in torch.as_tensor(values, dtype=dtype).tolist())
    return tuple(_reduced(_float32(float(v)), dtype) for v in values)


def _float32(value: float) -> float:
    """``value`` rounded to float32 (to nearest, ties to even; infinite past its range)."""
    if math.isinf(value) or math.isnan(value):
        return value
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:  # past float32's range: torch gives an infinity
        return math.copysign(math.inf, value)


def _reduced(value: float, dtype: torch.dtype) -> float:
    """A float32 ``value`` rounded to float16 or bfloat16 (to nearest, ties to even)."""
    if dtype == torch.float32 or math.isnan(value):
        return value
    if dtype == torch.float16:
        try:
            return float(struct.unpack("<e", struct.pack("<e", value))[0])
        except OverflowError:  # past float16's range
            return math.copysign(math.inf, value)
    # bfloat16 is float32's upper 16 bits: round the lower 16 away, ties to even.
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0])


class HostScalarBoxCoder(BoxCoder):
    """torchvision's ``BoxCoder`` (same weights, clamp and results) with Python scalars
    where it made tensors from Python numbers on the boxes' device."""

    def encode_single(self, reference_boxes: Tensor, proposals: Tensor) -> Tensor:
        """The regression targets of ``proposals`` towards ``reference_boxes``.

        Args:
            reference_boxes: ``[N, 4]`` xyxy, the boxes to reach (ground truths).
            proposals: ``[N, 4]`` xyxy, the boxes they are encoded from.

        Returns:
            ``[N, 4]`` ``(dx, dy, dw, dh)`` times the weights, in the promoted dtype of
            the two.
        """
        # torchvision's encode_boxes, its weights in the reference boxes' dtype.
        wx, wy, ww, wh = values_in(self.weights, reference_boxes.dtype)
        proposals_x1 = proposals[:, 0].unsqueeze(1)
        proposals_y1 = proposals[:, 1].unsqueeze(1)
        proposals_x2 = proposals[:, 2].unsqueeze(1)
        proposals_y2 = proposals[:, 3].unsqueeze(1)
        reference_x1 = reference_boxes[:, 0].unsqueeze(1)
        reference_y1 = reference_boxes[:, 1].unsqueeze(1)
        reference_x2 = reference_boxes[:, 2].unsqueeze(1)
        reference_y2 = reference_boxes[:, 3].unsqueeze(1)

        ex_widths = proposals_x2 - proposals_x1
        ex_heights = proposals_y2 - proposals_y1
        ex_ctr_x = proposals_x1 + 0.5 * ex_widths
        ex_ctr_y = proposals_y1 + 0.5 * ex_heights
        gt_widths = reference_x2 - reference_x1
        gt_heights = reference_y2 - reference_y1
        gt_ctr_x = reference_x1 + 0.5 * gt_widths
        gt_ctr_y = reference_y1 + 0.5 * gt_heights

        targets_dx = wx * (gt_ctr_x - ex_ctr_x) / ex_widths
        targets_dy = wy * (gt_ctr_y - ex_ctr_y) / ex_heights
        targets_dw = ww * torch.log(gt_widths / ex_widths)
        targets_dh = wh * torch.log(gt_heights / ex_heights)
        return torch.cat((targets_dx, targets_dy, targets_dw, targets_dh), dim=1)

    def decode_single(self, rel_codes: Tensor, boxes: Tensor) -> Tensor:
        """``boxes`` moved by the regression ``rel_codes`` (torchvision's decoding; the
        size deltas clamped at ``bbox_xform_clip`` before ``exp``).

        Args:
            rel_codes: ``[N, 4K]`` ``(dx, dy, dw, dh)`` times the weights, ``K`` per box.
            boxes: ``[N, 4]`` xyxy, cast to ``rel_codes``' dtype.

        Returns:
            ``[N, 4K]`` xyxy in ``rel_codes``' dtype.
        """
        boxes = boxes.to(rel_codes.dtype)
        widths = boxes[:, 2] - boxes[:, 0]
        heights = boxes[:, 3] - boxes[:, 1]
        ctr_x = boxes[:, 0] + 0.5 * widths
        ctr_y = boxes[:, 1] + 0.5 * heights

        wx, wy, ww, wh = self.weights  # divisors as Python floats, as torchvision has them
        dx = rel_codes[:, 0::4] / wx
        dy = rel_codes[:, 1::4] / wy
        dw = torch.clamp(rel_codes[:, 2::4] / ww, max=self.bbox_xform_clip)
        dh = torch.clamp(rel_codes[:, 3::4] / wh, max=self.bbox_xform_clip)

        pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
        pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
        pred_w = torch.exp(dw) * widths[:, None]
        pred_h = torch.exp(dh) * heights[:, None]
        # Half the size: torchvision multiplies by a 0-dim tensor of 0.5 in the same dtype.
        c_to_c_h = 0.5 * pred_h
        c_to_c_w = 0.5 * pred_w
        pred_boxes = torch.stack(
            (
                pred_ctr_x - c_to_c_w,
                pred_ctr_y - c_to_c_h,
                pred_ctr_x + c_to_c_w,
                pred_ctr_y + c_to_c_h,
            ),
            dim=2,
        )
        return pred_boxes.flatten(1)
