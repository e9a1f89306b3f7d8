"""``bayesian`` is a Gaussian process: a real study of the search space's distributions, on
a cheap objective in place of training, asked and told as the search controller does."""

from __future__ import annotations

import math
from typing import Any

import optuna

from maskops.automl.space import resolve_space
from maskops.automl.study import STARTUP_TRIALS, SearchSettings, open_study

SPACE = {
    "init_learning_rate": {"min": 1e-4, "max": 1e-1, "log": True},
    "warmup_steps": {"min": 0, "max": 100},
    "maskrcnn_config.batch_size_per_im": {"choices": [128, 256, 512]},
}
BEST_LR = 0.004
TRIALS = 12


def _metric(params: dict[str, Any]) -> float:
    """A mask AP peaking at BEST_LR, no warm-up and 256 RoIs (1.0 there)."""
    lr_error = (math.log10(params["init_learning_rate"]) - math.log10(BEST_LR)) ** 2
    warmup_error = (params["warmup_steps"] / 100) ** 2
    roi_error = 0.0 if params["maskrcnn_config.batch_size_per_im"] == 256 else 0.2
    return 1.0 - lr_error - warmup_error - roi_error


def _search(seed: int) -> optuna.Study:
    settings = SearchSettings(algorithm="bayesian", metric="mask_AP", seed=seed)
    study = open_study("gp", None, settings)
    distributions = {p.path: p.distribution() for p in resolve_space(SPACE)}
    for _ in range(TRIALS):
        trial = study.ask(distributions)
        study.tell(trial, _metric(trial.params))
    return study


def test_bayesian_proposes_with_a_gaussian_process_seeded() -> None:
    study = _search(seed=3)
    assert isinstance(study.sampler, optuna.samplers.GPSampler)
    assert study.user_attrs["sampler"] == "gp"
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    # After the random start, each trial is the GP's proposal (its expected improvement's
    # best point), which Optuna records on the trial.
    proposed = ["gp:relative_params:0" in t.system_attrs for t in study.trials]
    assert proposed == [False] * STARTUP_TRIALS + [True] * (TRIALS - STARTUP_TRIALS)
    # The proposals close in on the optimum, far beyond what the random start found.
    start = max(t.value or 0.0 for t in study.trials[:STARTUP_TRIALS])
    assert study.best_value > 0.9 > start, [(t.params, t.value) for t in study.trials]
    assert abs(math.log10(study.best_params["init_learning_rate"] / BEST_LR)) < 0.3
    # Seeded like the other samplers: the same seed proposes the same trials.
    again = _search(seed=3)
    assert [t.params for t in again.trials] == [t.params for t in study.trials]
