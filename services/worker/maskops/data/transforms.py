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


def resized_hw(height: int, width: int, image_size: tuple[int, int]) -> tuple[int, int]:
    """The (height, width) an image occupies inside ``image_size`` after resizing."""
    scale = fit_scale(height, width, image_size)
    return (
        min(image_size[0], max(1, round(height * scale))),
        min(image_size[1], max(1, round(width * scale))),
    )


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
    out = torch.zeros((3, *image_size), dtype=torch.float32, device=image.device)
    region = out[:, :new_h, :new_w]
    region.copy_(img)  # converts uint8 on the fly: no intermediate float image
    if img.dtype == torch.uint8:
        region.div_(255.0)
    return out, scale
