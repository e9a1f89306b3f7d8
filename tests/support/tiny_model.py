"""Small models and synthetic targets for the modeling and checkpoint tests (CPU-sized on
purpose; the root conftest registers the fixtures)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from maskops.spec.models import MaskRCNNConfig

TINY: dict[str, Any] = {
    "nlayers": 10,
    "rpn_batch_size_per_im": 64,
    "batch_size_per_im": 32,
    "train_rpn_pre_nms_topn": 100,
    "train_rpn_post_nms_topn": 50,
    "test_rpn_pre_nms_topn": 100,
    "test_rpn_post_nms_topn": 50,
    "fast_rcnn_mlp_head_dim": 64,
    "test_detections_per_image": 20,
}
"""Overrides that keep a forward/backward pass around a second on a busy 2-core CPU."""


def _tiny_config(**overrides: Any) -> MaskRCNNConfig:
    return MaskRCNNConfig(**{**TINY, **overrides})


def _make_targets(
    image_size: tuple[int, int], boxes: list[list[float]], labels: list[int]
) -> dict[str, torch.Tensor]:
    """Targets whose masks are ellipses inscribed in the (integer) boxes."""
    height, width = image_size
    masks = torch.zeros((len(boxes), height, width), dtype=torch.uint8)
    ys = torch.arange(height, dtype=torch.float32)[:, None] + 0.5
    xs = torch.arange(width, dtype=torch.float32)[None, :] + 0.5
    for i, (x1, y1, x2, y2) in enumerate(boxes):
        cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
        masks[i] = (((xs - cx) / rx) ** 2 + ((ys - cy) / ry) ** 2 <= 1).to(torch.uint8)
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "labels": torch.tensor(labels, dtype=torch.int64),
        "masks": masks,
    }


@pytest.fixture
def tiny_config() -> Callable[..., MaskRCNNConfig]:
    """``tiny_config(**overrides)``: a small MaskRCNNConfig."""
    torch.manual_seed(0)
    return _tiny_config


@pytest.fixture
def make_targets() -> Callable[..., dict[str, torch.Tensor]]:
    """``make_targets(image_size, boxes, labels)``: targets with elliptical masks."""
    return _make_targets


class FixedSampler:
    """A balanced sampler that returns the masks it was given, so that maskops' code and
    torchvision's, each given one, see the same samples: each image's masks cut or padded
    (nothing sampled) to the length of its labels, where maskops pads an image's
    proposals to the batch's most."""

    def __init__(
        self, masks: tuple[list[Tensor], list[Tensor]], batch_size_per_image: int = 0
    ) -> None:
        self.masks = masks
        self.batch_size_per_image = batch_size_per_image

    def __call__(self, labels: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        def fit(masks: list[Tensor]) -> list[Tensor]:
            return [
                torch.nn.functional.pad(mask, (0, len(row) - len(mask)))
                for mask, row in zip(masks, labels, strict=True)
            ]

        return fit(self.masks[0]), fit(self.masks[1])
