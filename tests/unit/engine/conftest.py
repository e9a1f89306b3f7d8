"""A CI-sized training spec over the shared demo shards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

# Small heads and sampling sizes: a step of resnet10 at 128x128 takes about a second on
# two cores instead of tens (the default 512 RoIs x 4-conv mask head dominates otherwise).
TINY_MODEL: dict[str, Any] = {
    "nlayers": 10,
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


def make_spec(shards: Path, val_json: Path | None = None, **overrides: Any) -> ExperimentSpec:
    """A resnet10 spec on ``shards`` at 128x128, batch 2; ``overrides`` replace any field
    (``data_config`` / ``maskrcnn_config`` entries given as dicts are merged)."""
    data = {
        "image_size": (128, 128),
        "training_file_pattern": f"{shards}/train*",
        "validation_file_pattern": f"{shards}/val*",
        "val_json_file": str(val_json) if val_json else "",
        "num_classes": 4,
        "n_workers": 0,
        "eval_samples": 4,
        **overrides.pop("data_config", {}),
    }
    model = {**TINY_MODEL, **overrides.pop("maskrcnn_config", {})}
    fields: dict[str, Any] = {
        "seed": 7,
        "total_steps": 4,
        "train_batch_size": 2,
        "eval_batch_size": 4,
        "init_learning_rate": 0.01,
        "warmup_learning_rate": 0.001,
        "warmup_steps": 2,
        "num_steps_per_eval": 0,
        **overrides,
    }
    return ExperimentSpec(
        **fields, data_config=DataConfig(**data), maskrcnn_config=MaskRCNNConfig(**model)
    )


@pytest.fixture
def spec_factory(demo_shards: Path) -> Any:
    def factory(**overrides: Any) -> ExperimentSpec:
        return make_spec(demo_shards, **overrides)

    return factory
