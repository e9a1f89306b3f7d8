"""Experiment trackers named by the spec: TAO's ``wandb_config`` and ``clearml_config``.

Each is a :class:`~maskops.engine.hooks.MetricWriter` fed the same metrics as the log,
``metrics.jsonl`` and TensorBoard. Their libraries are optional extras
(``pip install maskops[wandb]`` / ``maskops[clearml]``): :func:`check_trackers` fails at
training start, in one line naming the extra, when the spec turns a tracker on and its
library is not importable, so that a run never trains for hours without the logging asked
for.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from typing import Any

from maskops.engine.errors import TrainingError
from maskops.spec.models import ClearMLConfig, ExperimentSpec, WandBConfig

_LIBRARIES = {"wandb_config": ("wandb", "wandb"), "clearml_config": ("clearml", "clearml")}
"""Spec block -> (module to import, maskops extra that installs it)."""


def enabled_trackers(spec: ExperimentSpec) -> list[str]:
    """The spec blocks whose tracker is on: ``wandb_config`` when enabled and not in
    DISABLED mode; ``clearml_config`` whenever the block is written (TAO has no switch)."""
    names = []
    if spec.wandb_config is not None and spec.wandb_config.active:
        names.append("wandb_config")
    if spec.clearml_config is not None:
        names.append("clearml_config")
    return names


def check_trackers(spec: ExperimentSpec) -> None:
    """Raise :class:`TrainingError` if a tracker the spec turns on cannot be imported."""
    for block in enabled_trackers(spec):
        module, extra = _LIBRARIES[block]
        if importlib.util.find_spec(module) is None:
            raise TrainingError(
                f"{block}: the {module} package is not installed; "
                f"pip install maskops[{extra}] (or remove the {block} block)"
            )


class WandbWriter:
    """Metrics to a Weights & Biases run configured by ``wandb_config``."""

    def __init__(self, config: WandBConfig, spec: ExperimentSpec) -> None:
        wandb: Any = importlib.import_module("wandb")
        if config.key:
            wandb.login(key=config.key)
        # The spec as the run's config, without the API key.
        settings = spec.model_dump(mode="json")
        settings["wandb_config"].pop("key", None)
        self.run = wandb.init(
            project=config.project or None,
            entity=config.entity or None,
            name=config.name or None,
            tags=config.tags or None,
            notes=config.notes or None,
            dir=config.wandb_dir or None,
            mode=config.mode.lower(),
            reinit=config.reinit,
            config=settings,
        )

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def close(self) -> None:
        self.run.finish()


class ClearMLWriter:
    """Metrics to a ClearML task configured by ``clearml_config`` (each metric one scalar
    plot, titled by its name)."""

    def __init__(self, config: ClearMLConfig) -> None:
        clearml: Any = importlib.import_module("clearml")
        self.task = clearml.Task.init(
            project_name=config.project or "maskops",
            task_name=config.task or "train",
            tags=config.tags or None,
            reuse_last_task_id=config.reuse_last_task_id,
            continue_last_task=config.continue_last_task,
            deferred_init=config.deferred_init,
            # maskops reports its metrics itself; hooking torch.save would register (and
            # offline, copy) every checkpoint as an output model.
            auto_connect_frameworks=False,
        )
        self.logger = self.task.get_logger()

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):
                self.logger.report_scalar(title=key, series=key, value=value, iteration=step)

    def close(self) -> None:
        self.task.close()


def tracker_writers(spec: ExperimentSpec) -> list[WandbWriter | ClearMLWriter]:
    """Writers for the trackers the spec turns on (call :func:`check_trackers` first)."""
    writers: list[WandbWriter | ClearMLWriter] = []
    if spec.wandb_config is not None and spec.wandb_config.active:
        writers.append(WandbWriter(spec.wandb_config, spec))
    if spec.clearml_config is not None:
        writers.append(ClearMLWriter(spec.clearml_config))
    return writers
