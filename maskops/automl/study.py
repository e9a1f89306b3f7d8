"""Algorithms as Optuna samplers and pruners, the metric's direction, and the training hook
that reports a trial's in-training evaluations to its pruner.

One place maps each algorithm name (TAO's ``bayesian`` and ``hyperband``, plus ``asha``
and ``random``) to an Optuna sampler and pruner: the CLI search and the service's search
controller both build their study here. ``bayesian`` is a Gaussian process with expected
improvement, as TAO's is (Optuna's GPSampler, which needs scipy and torch).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

# The names are the search options' (their one home); named here too, where the search
# and tests look for them.
from maskops.automl.options import ALGORITHMS as ALGORITHMS
from maskops.automl.options import DEFAULT_METRIC as DEFAULT_METRIC
from maskops.automl.options import PRUNERS as PRUNERS
from maskops.automl.options import SAMPLERS as SAMPLERS
from maskops.training.trainer import HookBase

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)


DEFAULT_SAMPLER: dict[str, str] = {
    "bayesian": "gp",
    "random": "random",
    "hyperband": "tpe",
    "asha": "tpe",
}
"""The sampler of each algorithm unless a search names one: bayesian is a Gaussian process
(TAO's); Hyperband and ASHA pick configurations with TPE, cheaper per trial than fitting a
GP, for the many short trials they start."""
STARTUP_TRIALS = 2
"""Trials sampled at random before the GP (counting completed trials) or TPE (completed and
pruned) models the metric: a search is a few trials of costly training, so the model takes
over early."""

DEFAULT_PRUNER: dict[str, str] = {
    "bayesian": "median",
    "random": "median",
    "hyperband": "hyperband",
    "asha": "asha",
}
"""The pruner of each algorithm unless a search names one: bayesian and random stop a
trial worse than the median of the finished ones at the same step."""

PRUNED_REASON = "pruned by the AutoML search"
"""The stop reason of a trial its pruner stopped (the train job's ``stop_reason``)."""


def lower_is_better(metric: str) -> bool:
    """Losses are minimised, every other metric (COCO AP, AR) maximised."""
    return metric.lower().endswith("loss")


def direction(metric: str) -> str:
    return "minimize" if lower_is_better(metric) else "maximize"


@dataclass(frozen=True)
class SearchSettings:
    """What the study of a search is made of; kept in the study's user attributes so that
    any process (a trial's worker) rebuilds the same pruner."""

    algorithm: str = "bayesian"
    sampler: str = ""
    """"" = the algorithm's (:data:`DEFAULT_SAMPLER`)."""
    pruner: str = ""
    """"" = the algorithm's (:data:`DEFAULT_PRUNER`)."""
    metric: str = DEFAULT_METRIC
    min_resource: int = 1
    """Steps before the first pruning decision: the spec's num_steps_per_eval."""
    max_resource: int = 1
    """Steps of a whole trial: the spec's total steps."""
    reduction_factor: int = 3
    """Hyperband / ASHA's eta (TAO's automl_nu)."""
    seed: int | None = None

    @property
    def resolved_sampler(self) -> str:
        return self.sampler or DEFAULT_SAMPLER[self.algorithm]

    @property
    def resolved_pruner(self) -> str:
        return self.pruner or DEFAULT_PRUNER[self.algorithm]

    def attributes(self) -> dict[str, object]:
        return {
            "algorithm": self.algorithm,
            "sampler": self.resolved_sampler,
            "pruner": self.resolved_pruner,
            "metric": self.metric,
            "min_resource": self.min_resource,
            "max_resource": self.max_resource,
            "reduction_factor": self.reduction_factor,
            "seed": self.seed,
        }

    @classmethod
    def from_attributes(cls, attrs: dict[str, object]) -> SearchSettings:
        fields = {k: attrs[k] for k in cls().attributes() if k in attrs}
        return cls(**fields)  # type: ignore[arg-type]


def make_sampler(settings: SearchSettings) -> optuna.samplers.BaseSampler:
    """The settings' sampler, seeded by them (its random start included)."""
    import optuna

    name = settings.resolved_sampler
    if name == "random":
        return optuna.samplers.RandomSampler(seed=settings.seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=STARTUP_TRIALS)
    if name == "gp":
        # Optuna marks GPSampler experimental: the lock pins its version, and the warning
        # would repeat in the log of every trial that rebuilds the study.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.GPSampler(seed=settings.seed, n_startup_trials=STARTUP_TRIALS)
    raise ValueError(f"unknown sampler {name!r} (one of {', '.join(SAMPLERS)})")


def make_pruner(settings: SearchSettings) -> optuna.pruners.BasePruner:
    import optuna

    name = settings.resolved_pruner
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=1, n_warmup_steps=settings.min_resource - 1
        )
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=settings.min_resource, reduction_factor=settings.reduction_factor
        )
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=settings.min_resource,
            max_resource=max(settings.max_resource, settings.min_resource),
            reduction_factor=settings.reduction_factor,
        )
    raise ValueError(f"unknown pruner {name!r} (one of {', '.join(PRUNERS)})")


def open_study(
    name: str, storage: optuna.storages.BaseStorage | str | None, settings: SearchSettings
) -> optuna.Study:
    """Create the study, or load it as it was (a resumed search), with its settings."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=make_sampler(settings),
        pruner=make_pruner(settings),
        direction=direction(settings.metric),
        load_if_exists=True,
    )
    if not study.user_attrs:
        for key, value in settings.attributes().items():
            study.set_user_attr(key, value)
    return study


def load_study(name: str, storage: optuna.storages.BaseStorage | str) -> optuna.Study:
    """A search's study, with the sampler and pruner its settings name."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summary = optuna.load_study(study_name=name, storage=storage)
    settings = SearchSettings.from_attributes(dict(summary.user_attrs))
    return optuna.load_study(
        study_name=name,
        storage=storage,
        sampler=make_sampler(settings),
        pruner=make_pruner(settings),
    )


Report = Callable[[int, float], bool]
"""``report(step, value) -> should_prune``: one intermediate evaluation of a trial."""


def trial_reporter(trial: optuna.Trial) -> Report:
    """A :data:`Report` of ``trial`` to its study's pruner."""

    def report(step: int, value: float) -> bool:
        trial.report(value, step)
        return bool(trial.should_prune())

    return report


class PruningHook(HookBase):
    """After each periodic evaluation (every ``period`` steps, the spec's
    num_steps_per_eval), reports ``metric`` to ``report`` and stops the run cleanly (a
    checkpoint of the step, stop reason :data:`PRUNED_REASON`) when it says to prune. The
    final evaluation is the trial's value, not a pruning decision."""

    def __init__(self, metric: str, period: int, report: Report) -> None:
        self.metric = metric
        self.period = period
        self.report = report
        self.reported_step = -1

    def after_step(self) -> None:
        trainer = self.trainer
        step = trainer.iter
        if self.period <= 0 or step % self.period or step >= trainer.max_steps:
            return
        value = trainer.latest_metrics.get(self.metric)
        if value is None or not math.isfinite(value) or step == self.reported_step:
            return
        self.reported_step = step
        if self.report(step, float(value)):
            logger.info("step %d: %s %.5f; %s", step, self.metric, value, PRUNED_REASON)
            trainer.request_stop(PRUNED_REASON)
