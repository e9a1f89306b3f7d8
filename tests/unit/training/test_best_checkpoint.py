"""Training keeps the best checkpoint by a validation metric; ``-m DIR/best|latest``."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from maskops.checkpoints.model_file import read_checkpoint
from maskops.checkpoints.run_directory import BEST_NAME, resolve_model_path
from maskops.cli.main import main
from maskops.spec import SpecError, parse_spec_text, spec_to_text
from maskops.spec.models import ExperimentSpec
from maskops.training import run_training
from maskops.training.hooks import BEST_FILE, BestCheckpointHook, EvalHook
from maskops.training.trainer import AmpSettings, Trainer

SpecFactory = Callable[..., ExperimentSpec]


class _Scalar(nn.Module):
    """One parameter pulled towards 1: a model cheap enough to run many steps."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, images: Any, targets: Any) -> dict[str, torch.Tensor]:
        return {"loss": ((self.w - 1.0) ** 2).sum()}


def _run(values: list[float], directory: Path, *, lower_is_better: bool = False) -> list[int]:
    """Train len(values) steps evaluating after each, the evaluation reporting ``values``
    in turn as ``metric``; the steps at which the best checkpoint was written."""
    model = _Scalar()
    trainer = Trainer(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data=itertools.repeat(([torch.zeros(1)], [{}])),
        schedule=lambda step: 0.1,
        max_steps=len(values),
        device=torch.device("cpu"),
        amp=AmpSettings(enabled=False, device_type="cpu"),
    )
    saved: list[int] = []

    def save(step: int) -> Path:
        saved.append(step)
        path = directory / BEST_NAME
        torch.save({"step": step, "w": model.w.detach().clone()}, path)
        return path

    evaluations = iter(values)
    eval_hook = EvalHook(1, lambda model, step: {"metric": next(evaluations)})
    best = BestCheckpointHook("metric", eval_hook, save, directory, lower_is_better=lower_is_better)
    trainer.register_hooks([eval_hook, best])
    trainer.train()
    return saved


def test_best_checkpoint_follows_a_metric_that_rises_then_falls(tmp_path: Path) -> None:
    saved = _run([0.2, 0.5, 0.45, 0.5, 0.1], tmp_path)
    assert saved == [1, 2]  # improvements only; a tie (step 4) keeps the earlier one
    record = json.loads((tmp_path / BEST_FILE).read_text())
    assert (record["metric"], record["step"], record["value"]) == ("metric", 2, 0.5)
    assert record["checkpoint"] == BEST_NAME
    assert record["history"] == [[1, 0.2], [2, 0.5], [3, 0.45], [4, 0.5], [5, 0.1]]
    assert torch.load(tmp_path / BEST_NAME)["step"] == 2


def test_lower_is_better_for_the_validation_loss(tmp_path: Path) -> None:
    assert _run([3.0, 2.0, 2.5, 1.0], tmp_path, lower_is_better=True) == [1, 2, 4]
    assert json.loads((tmp_path / BEST_FILE).read_text())["value"] == 1.0


def test_metric_field_is_validated() -> None:
    assert parse_spec_text('best_checkpoint_metric: "AP50"\n').best_checkpoint_metric == "AP50"
    with pytest.raises(SpecError, match="not a validation metric") as info:
        parse_spec_text('seed: 1\nbest_checkpoint_metric: "accuracy"\n')
    assert (info.value.line, info.value.field) == (2, "best_checkpoint_metric")
    with pytest.raises(SpecError, match="include_mask"):
        parse_spec_text(
            'best_checkpoint_metric: "mask_AP"\nmaskrcnn_config {\n  include_mask: false\n}\n'
        )


def test_training_keeps_best_and_cli_takes_best_or_latest(
    spec_factory: SpecFactory, tmp_path: Path
) -> None:
    spec = spec_factory(total_steps=3, num_steps_per_eval=1, keep_checkpoints=1)
    crafted = {1: 0.3, 2: 0.6, 3: 0.4}
    run_dir = tmp_path / "run"
    run_training(spec, run_dir, eval_fn=lambda model, step: {"mask_AP": crafted[step]})

    record = json.loads((run_dir / BEST_FILE).read_text())
    assert (record["metric"], record["step"], record["value"]) == ("mask_AP", 2, 0.6)
    assert read_checkpoint(run_dir / BEST_NAME)["step"] == 2
    assert resolve_model_path(run_dir / "best") == run_dir / BEST_NAME
    assert resolve_model_path(run_dir / "latest") == run_dir / "model.step-3.pth"
    assert resolve_model_path(run_dir) == run_dir / BEST_NAME
    # Not a results directory: left for the model loader to open or report.
    assert resolve_model_path(tmp_path / "elsewhere" / "best") == tmp_path / "elsewhere" / "best"
    with pytest.raises(FileNotFoundError, match=r"no model\.best\.pth"):
        resolve_model_path(tmp_path / "best")

    spec_file = tmp_path / "spec.txt"
    spec_file.write_text(spec_to_text(spec))
    results = tmp_path / "eval"
    args = ["evaluate", "-e", str(spec_file), "-m", str(run_dir / "best"), "-r", str(results)]
    assert main(args) == 0
    report = json.loads((results / "evaluation.json").read_text())
    assert report["model"] == str(run_dir / BEST_NAME)
