"""Geometric preprocessing shared by training, evaluation, inference and serving.

The model never resizes: every image is resized keeping its aspect ratio so that it fits
``image_size`` and then padded (bottom/right, zeros) to exactly ``image_size``. Boxes the
model predicts are in that resized frame; divide by ``scale`` to get original pixels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fit_scale(height: int, width: int, image_size: tuple[int, int]) -> float:
    """The factor that makes an ``height x width`` image fit inside ``image_size`` (H, W)."""
    return min(image_size[0] / height, image_size[1] / width)


def resize_and_pad(image: torch.Tensor, image_size: tuple[int, int]) -> tuple[torch.Tensor, float]:
    """Resize an image keeping its aspect ratio to fit ``image_size``, then pad to it.

    Args:
        image: ``[3, H, W]`` uint8 (0..255) or float (0..1) tensor.
        image_size: target ``(height, width)``.

    Returns:
        ``([3, image_size[0], image_size[1]]`` float32 tensor in 0..1, ``scale``), where
        ``scale`` maps original pixel coordinates to the returned frame.
    """
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"expected a [3, H, W] image, got shape {tuple(image.shape)}")
    img = image.float().div_(255.0) if image.dtype == torch.uint8 else image.float()
    height, width = int(img.shape[1]), int(img.shape[2])
    scale = fit_scale(height, width, image_size)
    new_h = min(image_size[0], max(1, round(height * scale)))
    new_w = min(image_size[1], max(1, round(width * scale)))
    if (new_h, new_w) != (height, width):
        img = F.interpolate(
            img[None], size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True
        )[0]
    out = img.new_zeros((3, image_size[0], image_size[1]))
    out[:, :new_h, :new_w] = img
    return out, scale
