"""A search in this process (``maskops automl``): each trial trains the spec with its
sampled fields into ``RESULTS_DIR/trial_<n>``, reporting its evaluations to the pruner.

The study lives in ``RESULTS_DIR/automl.db`` (SQLite) unless a storage URL is given, so a
search run again with the same RESULTS_DIR continues: finished trials are kept, a trial
that was interrupted is trained again from its checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maskops.automl.space import Param, apply_params
from maskops.automl.study import (
    PRUNED_REASON,
    PruningHook,
    SearchSettings,
    open_study,
    trial_reporter,
)
from maskops.spec.models import ExperimentSpec

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)

STUDY_NAME = "maskops-automl"
RESULT_FILE = "automl_result.json"


@dataclass(frozen=True)
class TrialOutcome:
    number: int
    state: str
    """``complete``, ``pruned`` or ``fail``."""
    params: dict[str, Any]
    value: float | None
    results_dir: str
    checkpoint: str | None = None
    steps: int = 0
    """Steps the trial trained (fewer than the spec's for a pruned one)."""


@dataclass
class SearchResult:
    metric: str
    direction: str
    trials: list[TrialOutcome] = field(default_factory=list)
    best: TrialOutcome | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "direction": self.direction,
            "best": vars(self.best) if self.best else None,
            "trials": [vars(t) for t in self.trials],
        }


def trial_spec(base: ExperimentSpec, params: dict[str, Any], metric: str) -> ExperimentSpec:
    """The spec a trial trains: ``base`` with its sampled fields; the best checkpoint is
    chosen by the search's metric where that is a validation metric of the spec."""
    spec = apply_params(base, params)
    if not base.best_checkpoint_metric and metric != spec.resolved_best_checkpoint_metric:
        try:
            spec = apply_params(spec, {"best_checkpoint_metric": metric})
        except ValueError:
            logger.warning("%s is no validation metric: best checkpoint by the default", metric)
    return spec


def _objective(
    base: ExperimentSpec, space: Sequence[Param], settings: SearchSettings, results_dir: Path
) -> Any:
    import optuna

    from maskops.training.train import run_training

    def objective(trial: optuna.Trial) -> float:
        params = {p.path: p.suggest(trial) for p in space}
        spec = trial_spec(base, params, settings.metric)
        # A retried trial trains on in the folder of the one it retries (its checkpoint).
        trial_dir = Path(
            trial.user_attrs.get("results_dir") or results_dir / f"trial_{trial.number}"
        )
        trial.set_user_attr("results_dir", str(trial_dir))
        hook = PruningHook(settings.metric, spec.num_steps_per_eval, trial_reporter(trial))
        outcome = run_training(spec, trial_dir, extra_hooks=[hook])
        trial.set_user_attr("steps", outcome.step)
        if outcome.checkpoint is not None:
            trial.set_user_attr("checkpoint", str(outcome.checkpoint))
        if outcome.stop_reason == PRUNED_REASON:
            raise optuna.TrialPruned()
        value = outcome.metrics.get(settings.metric)
        if value is None:
            raise ValueError(f"the trial's evaluation reports no {settings.metric}")
        return float(value)

    return objective


def run_search(
    base: ExperimentSpec,
    results_dir: Path,
    space: Sequence[Param],
    settings: SearchSettings,
    *,
    trials: int,
    parallel: int = 1,
    storage: str | None = None,
) -> SearchResult:
    """Run ``trials`` trials in all (counting those of an earlier run in ``results_dir``),
    ``parallel`` at once (threads); returns every trial and the best one."""
    results_dir.mkdir(parents=True, exist_ok=True)
    storage = storage or f"sqlite:///{results_dir / 'automl.db'}"
    study = open_study(STUDY_NAME, storage, settings)
    _retry_interrupted(study)
    done = _finished_trials(study)
    if trials > done:
        study.optimize(
            _objective(base, space, settings, results_dir),
            n_trials=trials - done,
            n_jobs=parallel,
            catch=(Exception,),
        )
    result = summarize(study, settings.metric)
    (results_dir / RESULT_FILE).write_text(json.dumps(result.to_json(), indent=2))
    return result


def _finished_trials(study: optuna.Study) -> int:
    """Finished trials, leaving out the interrupted ones that a later trial retried (in the
    same folder): each counts once, as its retry."""
    counted: dict[str, bool] = {}
    others = 0
    for trial in study.trials:  # by number: a retry comes after what it retries
        folder = trial.user_attrs.get("results_dir")
        if folder is None:
            others += trial.state.is_finished()
        else:
            counted[folder] = trial.state.is_finished()
    return others + sum(counted.values())


def _retry_interrupted(study: optuna.Study) -> None:
    """A trial left running by a killed search is trained again, from its checkpoint in
    the same trial folder: queued with its parameters (the one left running fails)."""
    import optuna

    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs=dict(trial.user_attrs))


def summarize(study: optuna.Study, metric: str) -> SearchResult:
    """Every finished trial and the best completed one."""
    import optuna

    states = {
        optuna.trial.TrialState.COMPLETE: "complete",
        optuna.trial.TrialState.PRUNED: "pruned",
        optuna.trial.TrialState.FAIL: "fail",
    }
    result = SearchResult(metric=metric, direction=study.direction.name.lower())
    for trial in study.trials:
        if trial.state not in states:
            continue
        result.trials.append(
            TrialOutcome(
                number=trial.number,
                state=states[trial.state],
                params=dict(trial.params),
                value=trial.value,
                results_dir=str(trial.user_attrs.get("results_dir", "")),
                checkpoint=trial.user_attrs.get("checkpoint"),
                steps=int(trial.user_attrs.get("steps", 0)),
            )
        )
    completed = [t for t in result.trials if t.state == "complete"]
    if completed:
        best = study.best_trial.number
        result.best = next(t for t in completed if t.number == best)
    return result
