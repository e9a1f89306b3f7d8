"""Rewrites applied to a copy of the model before tracing: the same maths, a faster graph.

The mask predictor upsamples with ``ConvTranspose2d(256, 256, kernel_size=2, stride=2)``,
then ReLU and the 1x1 logits conv. onnxruntime's CPU ConvTranspose has no blocked-layout
kernel: with its ReLU it took 8% of a resnet50 graph at 512x640, as much as a 3x3 conv of
the mask head with four times the multiply-adds. A transposed conv whose kernel equals its
stride (no padding) writes each input pixel's contribution into its own ``s x s`` output
block: output sub-pixel ``(i, j)`` is a 1x1 conv with the kernel's ``[:, :, i, j]`` slice.
ReLU and the 1x1 logits conv act per pixel, so each sub-pixel's logits can be computed at
the input resolution and only the ``K``-channel logits interleaved into the ``s``-times
larger map. (Interleaving the 256-channel features instead, a 1x1 conv plus DepthToSpace,
was no faster: the shuffle of 100 RoIs' features cost what the transposed conv had.)

The trained model is left as it is (its weights stay torchvision's layout); only the
traced copy changes, and the export's parity check compares the graph with the unmodified
model.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


class SubpixelMaskPredictor(nn.Module):
    """torchvision's ``MaskRCNNPredictor`` (``conv5_mask`` transposed conv with kernel ==
    stride, ``relu``, 1x1 ``mask_fcn_logits``) computed per output sub-pixel.

    Input ``[R, C, M/s, M/s]`` mask-head features -> ``[R, K, M, M]`` float32 mask logits,
    equal to the source predictor's up to float rounding.
    """

    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        if not is_subpixel_predictor(source):
            raise ValueError(f"not a transposed-conv + ReLU + 1x1 mask predictor: {source}")
        upsample = source.get_submodule("conv5_mask")
        logits = source.get_submodule("mask_fcn_logits")
        assert isinstance(upsample, nn.ConvTranspose2d) and isinstance(logits, nn.Conv2d)
        stride = int(upsample.stride[0])
        self.stride = stride
        self.subpixels = nn.ModuleList()
        for i in range(stride):
            for j in range(stride):
                conv = nn.Conv2d(upsample.in_channels, upsample.out_channels, 1)
                # ConvTranspose weight is [C_in, C_out, s, s]; a conv's is [C_out, C_in, 1, 1].
                kernel = upsample.weight.detach()[:, :, i, j].t()
                conv.weight = nn.Parameter(kernel[:, :, None, None].clone(), requires_grad=False)
                bias = upsample.bias
                conv.bias = nn.Parameter(
                    bias.detach().clone() if bias is not None else torch.zeros(conv.out_channels),
                    requires_grad=False,
                )
                self.subpixels.append(conv)
        self.logits = copy.deepcopy(logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [R, K, s*s, H, W] with sub-pixel (i, j) at index i*s + j, which is where
        # pixel_shuffle reads block position (i, j) of each channel from.
        stacked = torch.stack([self.logits(F.relu(conv(x))) for conv in self.subpixels], dim=2)
        rois, classes, subpixels, height, width = stacked.shape
        # Explicit sizes, not flatten(1, 2): traced, that is a Reshape with a -1, which
        # onnxruntime cannot resolve when there are no RoIs (an image without detections).
        merged = stacked.reshape(rois, classes * subpixels, height, width)
        return F.pixel_shuffle(merged, self.stride).float()


def is_subpixel_predictor(module: nn.Module) -> bool:
    """Whether ``module`` is a mask predictor :class:`SubpixelMaskPredictor` reproduces."""
    upsample = getattr(module, "conv5_mask", None)
    relu = getattr(module, "relu", None)
    logits = getattr(module, "mask_fcn_logits", None)
    return (
        isinstance(upsample, nn.ConvTranspose2d)
        and upsample.kernel_size[0] == upsample.kernel_size[1] == upsample.stride[0]
        and upsample.stride[0] == upsample.stride[1]
        and upsample.padding == (0, 0)
        and upsample.output_padding == (0, 0)
        and upsample.dilation == (1, 1)
        and upsample.groups == 1
        and isinstance(relu, nn.ReLU)
        and isinstance(logits, nn.Conv2d)
        and logits.kernel_size == (1, 1)
        and logits.stride == (1, 1)
        and logits.padding == (0, 0)
        and logits.groups == 1
    )


def rewrite_for_export(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every mask predictor of that form computed per
    sub-pixel (see the module docstring); ``model`` itself is not changed."""
    rewritten = copy.deepcopy(model)
    for name, module in list(rewritten.named_modules()):
        if name and is_subpixel_predictor(module):
            parent_name, _, child = name.rpartition(".")
            parent = rewritten.get_submodule(parent_name) if parent_name else rewritten
            setattr(parent, child, SubpixelMaskPredictor(module))
    return rewritten
