"""Models for the end-to-end tests: an untrained checkpoint of the shared ``tiny_spec``
(the trained one is the shared ``tiny_checkpoint``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maskops.spec.models import ExperimentSpec


@pytest.fixture(scope="session")
def untrained_checkpoint(
    tmp_path_factory: pytest.TempPathFactory, tiny_spec: ExperimentSpec, demo_shards: Path
) -> Path:
    """``tiny_spec``'s model, randomly initialised (seed 0), saved with save_checkpoint."""
    from maskops.checkpoints.model_file import save_checkpoint
    from maskops.data.manifest import load_label_map
    from maskops.modeling import build_model

    label_map = load_label_map(f"{demo_shards}/val*")
    torch.manual_seed(0)
    model = build_model(
        tiny_spec.maskrcnn_config,
        num_classes=label_map.num_classes,
        image_size=tiny_spec.data_config.image_size,
    )
    path = tmp_path_factory.mktemp("untrained") / "model.pth"
    return save_checkpoint(path, model=model, spec=tiny_spec, label_map=label_map, step=0)


@pytest.fixture(params=["untrained", "trained"])
def model_file(request: pytest.FixtureRequest) -> Path:
    """Each end-to-end test runs on an untrained and on a (barely) trained model."""
    name = "untrained_checkpoint" if request.param == "untrained" else "tiny_checkpoint"
    path: Path = request.getfixturevalue(name)
    return path
