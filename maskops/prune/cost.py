"""Model size and compute: parameter counts and multiply-accumulates.

Two figures: the dense part (backbone, FPN and RPN head, which run over the whole padded
image, so their cost is fixed by image_size) and the per-RoI part (box head + predictor for
one proposal, mask head + predictor for one detection), whose total depends on how many
proposals and detections an image has (up to test_rpn_post_nms_topn and
test_detections_per_image).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements (trainable or frozen; buffers excluded)."""
    return sum(p.numel() for p in model.parameters())


def roi_output_size(pool: nn.Module | None) -> tuple[int, int]:
    """(h, w) of a RoIAlign module's (``MultiScaleRoIAlign``'s) output."""
    size = getattr(pool, "output_size", None)
    if isinstance(size, int):
        return (size, size)
    if isinstance(size, tuple | list) and len(size) == 2:
        return (int(size[0]), int(size[1]))
    raise ValueError(f"cannot tell the RoIAlign output size of {type(pool).__name__}")


def output_positions(
    model: nn.Module, image_size: tuple[int, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Output positions per Conv2d/Linear: (dense part on one image, RoI heads for one RoI).

    A conv's positions are its output's spatial size summed over its calls (the RPN head
    runs once per pyramid level); a Linear's are its output rows. Pruning changes channels,
    not positions, so one forward serves to count MACs before and after (see ``macs``). The
    dense part runs on a zero ``[1, 3, H, W]`` image with ``(H, W) = image_size``; the RoI
    heads on one zero RoI of their RoIAlign size.
    """
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        raise ValueError("the model has no .backbone module: not a torchvision-style Mask R-CNN")
    rpn_head = getattr(getattr(model, "rpn", None), "head", None)
    roi_heads = getattr(model, "roi_heads", None)
    names = {m: n for n, m in model.named_modules()}
    positions: dict[str, int] = {}

    def hook(module: nn.Module, _inputs: Any, output: Any) -> None:
        if not isinstance(output, torch.Tensor):
            return
        if isinstance(module, nn.Conv2d):
            count = output.numel() // module.out_channels
        else:
            count = output.numel() // cast(nn.Linear, module).out_features
        positions[names[module]] = positions.get(names[module], 0) + count

    handles = [
        m.register_forward_hook(hook)
        for m in model.modules()
        if isinstance(m, nn.Conv2d | nn.Linear)
    ]
    was_training = model.training
    try:
        model.eval()
        device = next(model.parameters()).device
        with torch.inference_mode():
            features = list(backbone(torch.zeros(1, 3, *image_size, device=device)).values())
            if isinstance(rpn_head, nn.Module):
                rpn_head(features)
            dense = dict(positions)
            positions.clear()
            channels = features[0].shape[1]
            for head, predictor, pool in (
                ("box_head", "box_predictor", "box_roi_pool"),
                ("mask_head", "mask_predictor", "mask_roi_pool"),
            ):
                module = getattr(roi_heads, head, None)
                if isinstance(module, nn.Module):
                    size = roi_output_size(getattr(roi_heads, pool, None))
                    out = module(torch.zeros(1, channels, *size, device=device))
                    getattr(roi_heads, predictor)(out)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return dense, dict(positions)


def macs(model: nn.Module, positions: dict[str, int]) -> int:
    """Multiply-accumulates of the layers in ``positions`` with the model's current shapes.

    A conv costs ``positions * C_out * C_in/groups * kH * kW``, a Linear
    ``positions * out_features * in_features``.
    """
    total = 0
    for name, module in model.named_modules():
        count = positions.get(name, 0)
        if isinstance(module, nn.Conv2d):
            kernel = module.kernel_size[0] * module.kernel_size[1]
            total += count * module.out_channels * (module.in_channels // module.groups) * kernel
        elif isinstance(module, nn.Linear):
            total += count * module.out_features * module.in_features
    return total
