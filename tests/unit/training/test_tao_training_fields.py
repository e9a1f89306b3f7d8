"""TAO 5.3 training fields: save_checkpoints_steps, global_gradient_clip_ratio,
logging_frequency, report_frequency, wandb_config and clearml_config; and maskops'
mlflow_config."""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from maskops.checkpoints.run_directory import list_checkpoints
from maskops.spec import SpecError, parse_spec_text, spec_to_text
from maskops.spec.models import ExperimentSpec
from maskops.training import HookBase, TrainingError, run_training
from maskops.training.hooks import GRADIENT_NORM
from maskops.training.trainer import AmpSettings, Batch, Trainer

SpecFactory = Callable[..., ExperimentSpec]


class _StatusSteps(HookBase):
    """Records the step ``status.json`` shows after each step (it runs after StatusHook)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[int] = []

    def after_step(self) -> None:
        self.seen.append(json.loads(self.path.read_text())["step"])


def test_checkpoint_logging_and_report_intervals(spec_factory: SpecFactory, tmp_path: Path) -> None:
    spec = spec_factory(
        total_steps=4,
        num_steps_per_eval=0,
        save_checkpoints_steps=2,
        logging_frequency=1,
        report_frequency=3,
        global_gradient_clip_ratio=0.5,
    )
    status = _StatusSteps(tmp_path / "status.json")
    run_training(spec, tmp_path, eval_fn=lambda model, step: {}, extra_hooks=[status])

    # Checkpoints every 2 steps although num_steps_per_eval (0) asks for none before the end.
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2, 4]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "Total loss" in r] == [1, 2, 3, 4]
    # Clipping on: the pre-clip norm is logged, and a fresh model's norm exceeds 0.5.
    assert all(r[GRADIENT_NORM] > 0.5 for r in records if "Total loss" in r)
    # status.json is rewritten at step 3 only (start: 0; end: 4 after the loop).
    assert status.seen == [0, 0, 3, 3]
    assert json.loads((tmp_path / "status.json").read_text())["step"] == 4


def test_default_intervals_are_unchanged(spec_factory: SpecFactory, tmp_path: Path) -> None:
    # 0 = unset: checkpoints follow num_steps_per_eval, logs every 10 steps (and the last).
    spec = spec_factory(total_steps=4, num_steps_per_eval=3)
    run_training(spec, tmp_path, eval_fn=lambda model, step: {})
    assert [step for step, _ in list_checkpoints(tmp_path)] == [3, 4]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "Total loss" in r] == [4]
    assert not any(GRADIENT_NORM in r for r in records)


class _Quadratic(nn.Module):
    """``loss = 0.5 * |w - target|^2``: the gradient is ``w - target``, known exactly."""

    def __init__(self, start: torch.Tensor, target: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(start.clone())
        self.target = target

    def forward(self, images: Any, targets: Any) -> dict[str, torch.Tensor]:
        return {"loss": 0.5 * ((self.w - self.target) ** 2).sum()}


def _one_step(clip: float) -> tuple[torch.Tensor, float | None]:
    """The update one SGD step (lr 0.1) makes from w=0 towards target (3, 4): grad norm 5."""
    model = _Quadratic(torch.zeros(2), torch.tensor([3.0, 4.0]))
    batches: itertools.repeat[Batch] = itertools.repeat(([torch.zeros(1)], [{}]))
    trainer = Trainer(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        data=batches,
        schedule=lambda step: 0.1,
        max_steps=1,
        device=torch.device("cpu"),
        amp=AmpSettings(enabled=False, device_type="cpu"),
        clip_grad_norm=clip,
    )
    trainer.train()
    norm = None if trainer.last_grad_norm is None else float(trainer.last_grad_norm)
    return model.w.detach(), norm


def test_global_gradient_clip_ratio_bounds_the_update_norm() -> None:
    unclipped, norm = _one_step(0.0)
    assert norm is None
    assert torch.allclose(unclipped, torch.tensor([0.3, 0.4]))  # lr * grad
    clipped, norm = _one_step(1.0)
    assert norm == pytest.approx(5.0)
    # Same direction, global norm 1 instead of 5.
    assert torch.allclose(clipped, torch.tensor([0.06, 0.08]))
    loose, _ = _one_step(10.0)  # a bound above the norm changes nothing
    assert torch.allclose(loose, unclipped)


TAO_FIELDS = """\
save_checkpoints_steps: 500
global_gradient_clip_ratio: 5.0
logging_frequency: 50
report_frequency: 25
wandb_config {
  enabled: true
  project: "mrcnn"
  tags: "a"
  tags: "b"
  mode: OFFLINE
}
clearml_config {
  project: "p"
  task: "t"
  tags: "x"
  deferred_init: true
}
"""


def test_tao_fields_parse_and_round_trip() -> None:
    spec = parse_spec_text(TAO_FIELDS)
    assert (spec.save_checkpoints_steps, spec.global_gradient_clip_ratio) == (500, 5.0)
    assert (spec.logging_frequency, spec.report_frequency) == (50, 25)
    assert spec.wandb_config is not None and spec.wandb_config.tags == ["a", "b"]
    assert spec.wandb_config.mode == "OFFLINE" and spec.wandb_config.active
    assert spec.clearml_config is not None and spec.clearml_config.deferred_init
    assert parse_spec_text(spec_to_text(spec)) == spec
    # Unset, they are absent from the text (TAO's samples leave them out), not written as 0.
    text = spec_to_text(ExperimentSpec())
    assert "save_checkpoints_steps" not in text and "wandb_config" not in text
    # An empty clearml_config block still means "on": it survives the round trip.
    empty = parse_spec_text("clearml_config {\n}\n")
    assert parse_spec_text(spec_to_text(empty)).clearml_config is not None
    mlflow = parse_spec_text('mlflow_config {\n  tracking_uri: "runs"\n  tags: "k=v"\n}\n')
    assert mlflow.mlflow_config is not None and mlflow.mlflow_config.tag_dict == {"k": "v"}
    assert parse_spec_text(spec_to_text(mlflow)) == mlflow
    # A local store is relative to the spec, as checkpoint is; a server URI is kept.
    resolved = mlflow.resolve_paths("/specs").mlflow_config
    assert resolved is not None and resolved.tracking_uri == "/specs/runs"
    server = parse_spec_text('mlflow_config {\n  tracking_uri: "http://mlflow:5000"\n}\n')
    assert server.resolve_paths("/specs") == server


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("seed: 1\nsave_checkpoints_steps: -5\n", 2, "save_checkpoints_steps", ">= 0"),
        ("global_gradient_clip_ratio: -1.0\n", 1, "global_gradient_clip_ratio", ">= 0"),
        ("logging_frequency: -1\n", 1, "logging_frequency", ">= 0"),
        ("report_frequency: 2.5\n", 1, "report_frequency", "integer"),
        ("wandb_config {\n  mode: LOUD\n}\n", 2, "wandb_config.mode", "LOUD"),
        ("wandb_config {\n  enable: true\n}\n", 2, "wandb_config.enable", "'enabled'"),
        ("clearml_config {\n  tags: 3\n}\n", 2, "clearml_config.tags", "string"),
        ('mlflow_config {\n  tags: "=x"\n}\n', 2, "mlflow_config.tags", "no key"),
    ],
)
def test_bad_values_name_field_and_line(text: str, line: int, field: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source="spec.txt")
    assert (info.value.line, info.value.field) == (line, field)
    assert words in info.value.message


@pytest.mark.parametrize(
    ("block", "module", "extra"),
    [
        ({"wandb_config": {"enabled": True}}, "wandb", "maskops[wandb]"),
        ({"clearml_config": {"project": "p"}}, "clearml", "maskops[clearml]"),
        ({"mlflow_config": {}}, "mlflow", "maskops[mlflow]"),
    ],
)
def test_tracker_without_its_library_fails_at_start(
    spec_factory: SpecFactory, tmp_path: Path, block: dict[str, Any], module: str, extra: str
) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed")
    with pytest.raises(TrainingError, match=re.escape(f"pip install {extra}")) as info:
        run_training(spec_factory(**block), tmp_path)
    assert "\n" not in str(info.value)
    assert not list_checkpoints(tmp_path)  # failed before training


def test_disabled_trackers_need_no_library(spec_factory: SpecFactory, tmp_path: Path) -> None:
    spec = spec_factory(
        total_steps=1, wandb_config={"enabled": True, "mode": "DISABLED", "key": "unused"}
    )
    result = run_training(spec, tmp_path, eval_fn=lambda model, step: {})
    assert result.step == 1


def test_training_evaluation_publishes_per_class_ap(
    spec_factory: SpecFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    caplog.set_level(logging.INFO, logger="maskops.train")
    run_training(spec_factory(total_steps=1), tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    final = next(r for r in records if "mask_AP" in r)
    names = ("circle", "square", "triangle")
    assert all(f"{k}/{n}" in final for k in ("AP", "mask_AP") for n in names)
    events = EventAccumulator(str(tmp_path / "events"))
    events.Reload()
    assert {f"mask_AP/{n}" for n in names} <= set(events.Tags()["scalars"])
    step_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert step_lines and not any("AP/circle" in line for line in step_lines)
    assert any("per-class AP" in r.getMessage() for r in caplog.records)


@dataclass(frozen=True)
class TrackedRun:
    """One short training run logged to every tracker whose library is installed."""

    root: Path
    spec: ExperimentSpec

    @property
    def results(self) -> Path:
        return self.root / "run"


TRACKERS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "wandb": lambda root: {
        "wandb_config": {
            "enabled": True,
            "project": "p",
            "mode": "OFFLINE",
            "wandb_dir": str(root / "wandb_runs"),
        }
    },
    "clearml": lambda root: {"clearml_config": {"project": "p", "task": "t"}},
    "mlflow": lambda root: {
        "mlflow_config": {
            "tracking_uri": str(root / "mlruns"),
            "experiment_name": "e",
            "run_name": "r",
            "tags": ["a=b"],
        }
    },
}
"""Each tracker's library and its spec block for a run under ``root``."""


@pytest.fixture(scope="module")
def tracked_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_spec: ExperimentSpec
) -> Iterator[TrackedRun]:
    # The trackers are optional extras (the lock installs them all, so CI runs every test
    # below). Offline modes write the runs locally: no account, server or network. The
    # real end-of-training COCO evaluation runs, so validation loss is logged beside AP.
    root = tmp_path_factory.mktemp("tracked")
    (root / "wandb_runs").mkdir()
    blocks: dict[str, Any] = {}
    for library, block in TRACKERS.items():
        if importlib.util.find_spec(library) is not None:
            blocks |= block(root)
    spec = ExperimentSpec.model_validate(
        tiny_spec.model_dump() | {"total_steps": 2, "logging_frequency": 1} | blocks
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_SILENT", "true")
        # W&B stages (copies) artifacts under WANDB_DATA_DIR: keep them out of the home dir.
        env.setenv("WANDB_DATA_DIR", str(root / "wandb_data"))
        env.setenv("WANDB_CACHE_DIR", str(root / "wandb_cache"))
        # Read when clearml is first imported.
        env.setenv("CLEARML_OFFLINE_MODE", "1")
        env.setenv("CLEARML_CACHE_DIR", str(root / "clearml"))
        run_training(spec, root / "run")
        yield TrackedRun(root, spec)


ARTIFACTS = {"model.best.pth", "best_checkpoint.json", "metrics.jsonl"}
"""What every tracker attaches at the end of the run (the best model kept, its record)."""


def test_wandb_offline_run_receives_the_training_metrics(tracked_run: TrackedRun) -> None:
    pytest.importorskip("wandb")
    runs = list(tracked_run.root.glob("wandb_runs/wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    # wandb 0.31 ships no reader for offline runs (its datastore module is gone; `wandb
    # sync` uploads them): the records' protobuf bytes hold every key and file name.
    record = runs[0].read_bytes()
    assert b"Total loss" in record and b"mask_AP" in record and b"val/Total loss" in record
    assert b"init_learning_rate" in record
    assert all(name.encode() in record for name in ARTIFACTS)


def test_clearml_offline_task_receives_the_training_metrics(tracked_run: TrackedRun) -> None:
    pytest.importorskip("clearml")
    logged = list((tracked_run.root / "clearml" / "offline").glob("*/metrics.jsonl"))
    assert len(logged) == 1
    text = logged[0].read_text()
    assert "Total loss" in text and "mask_AP" in text and "val/Total loss" in text
    # ClearML's offline session (what Task.import_offline_session uploads) as it stores it.
    task = json.loads((logged[0].parent / "task.json").read_text())
    assert task["hyperparams"]["spec"]["init_learning_rate"]["value"] == "0.004"
    assert {a["key"] for a in task["execution"]["artifacts"]} == ARTIFACTS


def test_mlflow_file_store_run_reads_back(tracked_run: TrackedRun) -> None:
    mlflow = pytest.importorskip("mlflow")
    store = tracked_run.root / "mlruns"
    with pytest.MonkeyPatch.context() as env:  # reading MLflow's file store needs the opt-in
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        client = mlflow.MlflowClient(store.as_uri())
        (run,) = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert (run.info.run_name, run.info.status, run.data.tags["a"]) == ("r", "FINISHED", "b")
    history = client.get_metric_history(run.info.run_id, "Total loss")
    assert sorted(m.step for m in history) == [1, 2]
    assert {"mask_AP", "val/Total loss", "per_class/mask_AP/circle"} <= set(run.data.metrics)
    assert run.data.params["data_config.image_size"] == "[128, 128]"
    assert float(run.data.params["init_learning_rate"]) == tracked_run.spec.init_learning_rate
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == ARTIFACTS


def test_validation_loss_is_logged_beside_ap(tracked_run: TrackedRun) -> None:
    # metrics.jsonl, TensorBoard and the job's metrics stream get the same records.
    lines = (tracked_run.results / "metrics.jsonl").read_text().splitlines()
    final = next(r for r in map(json.loads, lines) if "mask_AP" in r)
    assert final["val/Total loss"] > 0 and final["step"] == 2
