"""Geometric preprocessing shared by training, evaluation, inference and serving.

The model never resizes: every image is resized keeping its aspect ratio so that it fits
``image_size`` and then padded (bottom/right, zeros) to exactly ``image_size``. Boxes the
model predicts are in that resized frame; divide by ``scale`` to get original pixels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from maskops.serving.triton_models.maskops_serving_ops import fit_scale, resized_hw

__all__ = ["fit_scale", "resize_and_pad", "resized_hw"]


def resize_and_pad(
    image: torch.Tensor, image_size: tuple[int, int], *, keep_uint8: bool = False
) -> tuple[torch.Tensor, float]:
    """Resize an image keeping its aspect ratio to fit ``image_size``, then pad to it.

    Args:
        image: ``[3, H, W]`` uint8 (0..255) or float (0..1) tensor.
        image_size: target ``(height, width)``.
        keep_uint8: a uint8 ``image`` comes back uint8 in 0..255 (its float32 result
            divided by 255 exactly: :func:`maskops.modeling.transform.unit_range`).

    Returns:
        ``([3, image_size[0], image_size[1]]`` float32 tensor in 0..1, ``scale``), where
        ``scale`` maps original pixel coordinates to the returned frame.
    """
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"expected a [3, H, W] image, got shape {tuple(image.shape)}")
    height, width = int(image.shape[1]), int(image.shape[2])
    scale = fit_scale(height, width, image_size)
    new_h, new_w = resized_hw(height, width, image_size)
    img = image
    if (new_h, new_w) != (height, width):
        # uint8 stays uint8 through the resize: torch's uint8 antialiased bilinear kernel
        # is ~10-50x faster than the float one and differs by at most one grey level.
        img = F.interpolate(
            img[None], size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True
        )[0]
    uint8 = keep_uint8 and img.dtype == torch.uint8
    out = torch.zeros(
        (3, *image_size), dtype=torch.uint8 if uint8 else torch.float32, device=image.device
    )
    region = out[:, :new_h, :new_w]
    region.copy_(img)  # converts uint8 on the fly: no intermediate float image
    if img.dtype == torch.uint8 and not uint8:
        region.div_(255.0)
    return out, scale
