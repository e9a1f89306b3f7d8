"""The longer recipe: the demo data trained to high mask AP (not in CI: ``-m slow``).

    .venv/bin/pytest -m slow tests/unit/engine/test_recipe_slow.py

A resnet18 from scratch on 240 demo images at 256x256, batch 4, 1,500 steps with warmup
and two decays, COCO-evaluated on the 60 validation images every 500 steps; early stop at
mask AP 0.5. On an otherwise idle 2-core CPU this takes well over an hour.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from maskops.data.convert import convert_dataset
from maskops.data.demo import generate_demo_dataset
from maskops.engine import run_training
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

TARGET_MASK_AP = 0.5


@pytest.mark.slow
def test_demo_recipe_reaches_high_mask_ap(tmp_path: Path) -> None:
    demo = generate_demo_dataset(
        tmp_path / "demo", num_images=300, image_size=(256, 256), seed=1, val_fraction=0.2
    )
    convert_dataset(demo.train_images, demo.train_json, tmp_path / "shards")
    convert_dataset(demo.val_images, demo.val_json, tmp_path / "shards")
    spec = ExperimentSpec(
        seed=1,
        use_amp=True,
        total_steps=1500,
        train_batch_size=4,
        eval_batch_size=8,
        init_learning_rate=0.01,
        warmup_learning_rate=0.001,
        warmup_steps=100,
        learning_rate_steps=[1000, 1300],
        learning_rate_decay_levels=[0.1, 0.01],
        num_steps_per_eval=500,
        target_mask_ap=TARGET_MASK_AP,
        data_config=DataConfig(
            image_size=(256, 256),
            training_file_pattern=f"{tmp_path}/shards/train*",
            validation_file_pattern=f"{tmp_path}/shards/val*",
            val_json_file=str(demo.val_json),
            num_classes=4,
            n_workers=1,
        ),
        maskrcnn_config=MaskRCNNConfig(
            nlayers=18,
            min_level=2,
            max_level=6,
            anchor_scale=2.0,
            batch_size_per_im=128,
            fast_rcnn_mlp_head_dim=512,
            gt_mask_size=56,
        ),
    )
    result = run_training(spec, tmp_path / "run")
    assert result.metrics["mask_AP"] >= TARGET_MASK_AP, result.metrics
