"""A small spec over the shared demo shards and an untrained checkpoint for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

# resnet10 at 128x128 with small RPN/ROI budgets: a forward pass takes a fraction of a
# second on two cores.
SMALL_MODEL: dict[str, Any] = {
    "nlayers": 10,
    "max_level": 5,
    "anchor_scale": 4.0,
    "fast_rcnn_mlp_head_dim": 128,
    "test_rpn_pre_nms_topn": 100,
    "test_rpn_post_nms_topn": 50,
    "test_detections_per_image": 20,
    "mrcnn_resolution": 16,
}


def small_spec(shards: Path, val_json: Path, **maskrcnn: Any) -> ExperimentSpec:
    return ExperimentSpec(
        seed=3,
        eval_batch_size=3,
        data_config=DataConfig(
            image_size=(128, 128),
            training_file_pattern=f"{shards}/train*",
            validation_file_pattern=f"{shards}/val*",
            val_json_file=str(val_json),
            num_classes=4,
            n_workers=0,
        ),
        maskrcnn_config=MaskRCNNConfig(**{**SMALL_MODEL, **maskrcnn}),
    )


def save_untrained(path: Path, spec: ExperimentSpec, shards: Path) -> Path:
    from maskops.checkpoint import save_checkpoint
    from maskops.data.manifest import load_label_map
    from maskops.modeling import build_model

    label_map = load_label_map(f"{shards}/val*")
    torch.manual_seed(0)
    model = build_model(
        spec.maskrcnn_config, num_classes=label_map.num_classes,
        image_size=spec.data_config.image_size,
    )
    return save_checkpoint(path, model=model, spec=spec, label_map=label_map, step=0)


@pytest.fixture(scope="session")
def eval_spec(demo_dataset: Any, demo_shards: Path) -> ExperimentSpec:
    return small_spec(demo_shards, demo_dataset.val_json)


@pytest.fixture(scope="session")
def untrained_checkpoint(
    tmp_path_factory: pytest.TempPathFactory, eval_spec: ExperimentSpec, demo_shards: Path
) -> Path:
    return save_untrained(tmp_path_factory.mktemp("untrained") / "model.pth", eval_spec,
                          demo_shards)
