"""Experiment trackers named by the spec: TAO's ``wandb_config`` and ``clearml_config``, and
maskops' ``mlflow_config``.

Each is a :class:`~maskops.training.hooks.MetricWriter` fed the same metrics as the log,
``metrics.jsonl`` and TensorBoard; each also records the spec as the run's
hyper-parameters (:func:`hyperparameters`) and, when the run ends, its final artefacts
(:class:`RunEnd`). Their libraries are optional extras (``pip install maskops[wandb]`` /
``maskops[clearml]`` / ``maskops[mlflow]``): :func:`check_trackers` fails at training
start, in one line naming the extra, when the spec turns a tracker on and its library is
not importable, so that a run never trains for hours without the logging asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maskops.spec.models import ClearMLConfig, ExperimentSpec, MLflowConfig, WandBConfig
from maskops.training.errors import TrainingError
from maskops.training.hooks import is_per_class

_LIBRARIES = {
    "wandb_config": ("wandb", "wandb"),
    "clearml_config": ("clearml", "clearml"),
    "mlflow_config": ("mlflow", "mlflow"),
}
"""Spec block -> (module to import, maskops extra that installs it)."""

MLFLOW_EXPERIMENT = "maskops"
"""The MLflow experiment of a run whose mlflow_config names none."""
MLFLOW_LOCAL_DIR = "mlruns"
"""RESULTS_DIR/mlruns: the MLflow file store when neither the spec nor MLFLOW_TRACKING_URI
names a tracking URI."""


@dataclass(frozen=True)
class RunEnd:
    """How the training run ended: whether it failed, and the files to attach."""

    failed: bool
    artifacts: Sequence[Path] = ()


RunEndFn = Callable[[], RunEnd]
"""Called when the writers close (after the final checkpoint is written)."""


def enabled_trackers(spec: ExperimentSpec) -> list[str]:
    """The spec blocks whose tracker is on (:attr:`ExperimentSpec.enabled_trackers`)."""
    return spec.enabled_trackers


def check_trackers(spec: ExperimentSpec) -> None:
    """Raise :class:`TrainingError` if a tracker the spec turns on cannot be imported."""
    for block in enabled_trackers(spec):
        module, extra = _LIBRARIES[block]
        if importlib.util.find_spec(module) is None:
            raise TrainingError(
                f"{block}: the {module} package is not installed; "
                f"pip install maskops[{extra}] (or remove the {block} block)"
            )


def hyperparameters(spec: ExperimentSpec) -> dict[str, Any]:
    """The spec as every tracker records it (nested blocks as dicts), without the W&B key."""
    settings = spec.model_dump(mode="json")
    if settings.get("wandb_config"):
        settings["wandb_config"].pop("key", None)
    return settings


def flat_hyperparameters(spec: ExperimentSpec) -> dict[str, str]:
    """:func:`hyperparameters` flattened for MLflow: ``data_config.image_size`` -> text."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}{key}.", item)
        else:
            flat[prefix[:-1]] = value if isinstance(value, str) else json.dumps(value)

    walk("", hyperparameters(spec))
    return flat


class WandbWriter:
    """Metrics to a Weights & Biases run configured by ``wandb_config``; the final
    artefacts as one artifact of type ``model``."""

    def __init__(self, config: WandBConfig, spec: ExperimentSpec, run_end: RunEndFn) -> None:
        self.wandb: Any = importlib.import_module("wandb")
        self.run_end = run_end
        if config.key:
            self.wandb.login(key=config.key)
        self.run = self.wandb.init(
            project=config.project or None,
            entity=config.entity or None,
            name=config.name or None,
            tags=config.tags or None,
            notes=config.notes or None,
            dir=config.wandb_dir or None,
            mode=config.mode.lower(),
            reinit=config.reinit,
            config=hyperparameters(spec),
        )

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def close(self) -> None:
        end = self.run_end()
        if end.artifacts:
            artifact = self.wandb.Artifact(f"{self.run.id}-results", type="model")
            for path in end.artifacts:
                artifact.add_file(str(path))
            self.run.log_artifact(artifact)
        self.run.finish(exit_code=1 if end.failed else 0)


_CLEARML_NO_AUTO_CONNECT = {
    **dict.fromkeys(
        [
            *("catboost", "fastai", "gradio", "hydra", "joblib", "lightgbm", "matplotlib"),
            *("megengine", "pytorch", "scikit", "tensorboard", "tensorflow", "tfdefines"),
            "xgboost",
        ],
        False,
    ),
    "detect_repository": False,
}
"""ClearML's auto-connect switches, all off. maskops reports its metrics itself (hooking
torch.save would register, and offline copy, every checkpoint; hooking TensorBoard would
report each scalar twice). The repository and package analysis describes maskops' own
code, not the experiment (the spec is its hyper-parameters), and took up to its 300 s
timeout when the task closed. ``False`` alone would leave that analysis on; a framework
a later ClearML adds is connected by default."""


class ClearMLWriter:
    """Metrics to a ClearML task configured by ``clearml_config`` (each metric one scalar
    plot, titled by its name); the spec as the task's ``spec`` parameters; the final
    artefacts as task artifacts named by file."""

    def __init__(self, config: ClearMLConfig, spec: ExperimentSpec, run_end: RunEndFn) -> None:
        clearml: Any = importlib.import_module("clearml")
        self.run_end = run_end
        self.task = clearml.Task.init(
            project_name=config.project or "maskops",
            task_name=config.task or "train",
            tags=config.tags or None,
            reuse_last_task_id=config.reuse_last_task_id,
            continue_last_task=config.continue_last_task,
            deferred_init=config.deferred_init,
            auto_connect_frameworks=_CLEARML_NO_AUTO_CONNECT,
        )
        self.task.connect(hyperparameters(spec), name="spec")
        self.logger = self.task.get_logger()

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):
                self.logger.report_scalar(title=key, series=key, value=value, iteration=step)

    def close(self) -> None:
        end = self.run_end()
        for path in end.artifacts:
            # Synchronous: close() ends the task next, and an upload still queued is lost.
            self.task.upload_artifact(path.name, artifact_object=path, wait_on_upload=True)
        if end.failed:
            self.task.mark_failed(status_reason="training failed", force=True)
        self.task.close()


_MLFLOW_KEY_CHARS = re.compile(r"[^\w\-. /]")
"""What MLflow refuses in a metric name (a category name may hold anything)."""
MLFLOW_PER_CLASS = "per_class/"
"""Prefix of per-class metrics in MLflow (``per_class/mask_AP/circle``): its file store keeps
a metric in a file named by the key, so ``AP`` and ``AP/circle`` cannot both exist."""
_MLFLOW_BATCH = 100
"""Params per log_batch call: MLflow's limit."""


@contextmanager
def _file_store_allowed(config: MLflowConfig) -> Iterator[None]:
    """MLflow keeps its file store in maintenance mode and refuses it unless
    MLFLOW_ALLOW_FILE_STORE is set; a spec naming a local directory asks for it, so the
    store is opened with the variable set (and the environment left as it was)."""
    previous = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    if config.local_store:
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = previous


def mlflow_metric_key(key: str) -> str:
    """``key`` as MLflow stores it (see :data:`MLFLOW_PER_CLASS`)."""
    key = _MLFLOW_KEY_CHARS.sub("_", key)
    return MLFLOW_PER_CLASS + key if is_per_class(key) else key


def mlflow_tracking_uri(config: MLflowConfig, results_dir: Path) -> str:
    """The tracking URI of ``config`` (see :attr:`MLflowConfig.tracking_uri`)."""
    if not config.tracking_uri:
        default = results_dir.absolute() / MLFLOW_LOCAL_DIR
        return os.environ.get("MLFLOW_TRACKING_URI") or default.as_uri()
    if config.local_store and not config.tracking_uri.startswith("file:"):
        return Path(config.tracking_uri).absolute().as_uri()
    return config.tracking_uri


class MLflowWriter:
    """Metrics to an MLflow run configured by ``mlflow_config`` (through ``MlflowClient``:
    no process-wide active run); the spec as flat params; the final artefacts as run
    artifacts."""

    def __init__(
        self, config: MLflowConfig, spec: ExperimentSpec, results_dir: Path, run_end: RunEndFn
    ) -> None:
        mlflow: Any = importlib.import_module("mlflow")
        self.entities: Any = importlib.import_module("mlflow.entities")
        self.run_end = run_end
        uri = mlflow_tracking_uri(config, results_dir)
        with _file_store_allowed(config):
            self.client = mlflow.MlflowClient(uri)
            name = config.experiment_name or MLFLOW_EXPERIMENT
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(name)
            )
        run = self.client.create_run(
            experiment_id, run_name=config.run_name or None, tags=config.tag_dict
        )
        self.run_id: str = run.info.run_id
        params = [self.entities.Param(k, v) for k, v in flat_hyperparameters(spec).items()]
        for start in range(0, len(params), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + _MLFLOW_BATCH])

    def write(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [
            self.entities.Metric(mlflow_metric_key(key), value, now, step)
            for key, value in metrics.items()
            if math.isfinite(value)
        ]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        end = self.run_end()
        for path in end.artifacts:
            self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, status="FAILED" if end.failed else "FINISHED")


TrackerWriter = WandbWriter | ClearMLWriter | MLflowWriter


def tracker_writers(
    spec: ExperimentSpec, results_dir: Path, run_end: RunEndFn
) -> list[TrackerWriter]:
    """Writers for the trackers the spec turns on (call :func:`check_trackers` first)."""
    writers: list[TrackerWriter] = []
    if spec.wandb_config is not None and spec.wandb_config.active:
        writers.append(WandbWriter(spec.wandb_config, spec, run_end))
    if spec.clearml_config is not None:
        writers.append(ClearMLWriter(spec.clearml_config, spec, run_end))
    if spec.mlflow_config is not None:
        writers.append(MLflowWriter(spec.mlflow_config, spec, results_dir, run_end))
    return writers
