"""Small Mask R-CNNs to prune: resnet10/18 at 128x128 with CI-sized heads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from maskops.modeling import build_model
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

IMAGE_SIZE = (128, 128)

# Small RoI sampling and heads keep a train step of resnet10 at 128x128 near a second.
SMALL_HEADS: dict[str, Any] = {
    "max_level": 5,
    "anchor_scale": 4.0,
    "rpn_batch_size_per_im": 64,
    "batch_size_per_im": 32,
    "fast_rcnn_mlp_head_dim": 128,
    "train_rpn_pre_nms_topn": 200,
    "train_rpn_post_nms_topn": 100,
    "test_rpn_pre_nms_topn": 100,
    "test_rpn_post_nms_topn": 50,
    "test_detections_per_image": 20,
    "gt_mask_size": 28,
    "mrcnn_resolution": 16,
}


def make_spec(
    shards: Path | None = None, val_json: Path | None = None, **model: Any
) -> ExperimentSpec:
    """A spec at 128x128 (resnet10 unless ``nlayers`` is given), over ``shards`` if given."""
    data: dict[str, Any] = {"image_size": IMAGE_SIZE, "num_classes": 4, "n_workers": 0}
    if shards is not None:
        data |= {
            "training_file_pattern": f"{shards}/train*",
            "validation_file_pattern": f"{shards}/val*",
            "val_json_file": str(val_json or ""),
            "eval_samples": 4,
        }
    return ExperimentSpec(
        seed=3,
        total_steps=2,
        train_batch_size=2,
        eval_batch_size=4,
        init_learning_rate=0.01,
        warmup_steps=0,
        data_config=DataConfig(**data),
        maskrcnn_config=MaskRCNNConfig(**{"nlayers": 10, **SMALL_HEADS, **model}),
    )


def make_model(**model: Any) -> nn.Module:
    """A fresh random model (seeded), 4 classes; ``model`` overrides maskrcnn_config."""
    torch.manual_seed(0)
    spec = make_spec(**model)
    return build_model(spec.maskrcnn_config, num_classes=4, image_size=IMAGE_SIZE)


def training_batch(
    height: int, width: int
) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """One image ``[3, H, W]`` with two boxes/masks (xyxy, input frame)."""
    generator = torch.Generator().manual_seed(height * 1000 + width)
    image = torch.rand(3, height, width, generator=generator)
    boxes = torch.tensor([[8.0, 10.0, 60.0, 70.0], [50.0, 40.0, 110.0, 120.0]])
    masks = torch.zeros(2, height, width, dtype=torch.uint8)
    for i, (x0, y0, x1, y1) in enumerate(boxes.int().tolist()):
        masks[i, y0:y1, x0:x1] = 1
    return [image], [{"boxes": boxes, "labels": torch.tensor([1, 3]), "masks": masks}]
