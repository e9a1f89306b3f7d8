# ruff: noqa: RUF009 - option() is dataclasses.field with the declared metadata
"""What an AutoML search is asked for: the declaration of the search options, and the one
list of its algorithms, samplers and pruners.

:class:`AutomlOptions` holds the search's settings that both doors take: the ``maskops
automl`` flags (TAO's spellings: ``--trials``, ``--parallel``) and the REST automl job's
fields (under their names and TAO API's, ``automl_algorithm``, ``automl_nu``, ...) are
built from its fields (:mod:`maskops.options_schema`). The search space (the command
line's ``--param``, the job's ``hyperparameters`` and ``range_override``) is each door's
own. Standard library only, so that the control plane's core checks the names without
importing Optuna (:mod:`maskops.automl.study` maps them to Optuna).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from maskops.options_schema import option

Algorithm = Literal["bayesian", "hyperband", "asha", "random"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
SamplerName = Literal["gp", "tpe", "random"]
SAMPLERS: tuple[str, ...] = get_args(SamplerName)
PrunerName = Literal["none", "median", "hyperband", "asha"]
PRUNERS: tuple[str, ...] = get_args(PrunerName)
DEFAULT_METRIC = "mask_AP"
MAX_TRIALS = 1000
"""The most trials a search job may ask for."""
MAX_CONCURRENT_TRIALS = 64
"""The most trials (train jobs) a search job may queue or run at once."""


@dataclass(frozen=True)
class AutomlOptions:
    """The search's settings (declared: :mod:`maskops.options_schema`). The sampler and
    pruner left unset (None; "" on the command line) are the algorithm's
    (``maskops.automl.study.DEFAULT_SAMPLER``, ``DEFAULT_PRUNER``)."""

    algorithm: Algorithm = option(
        "bayesian",
        help="bayesian (Gaussian process, TAO's), hyperband, asha (successive halving) or random",
        rest=True,
        rest_aliases=("automl_algorithm",),
    )
    sampler: SamplerName | None = option(
        None,
        help="the sampler instead of the algorithm's: gp (Gaussian process with expected "
        "improvement; bayesian's), tpe (hyperband's and asha's) or random (random's)",
        rest=True,
        cli_default="",
    )
    max_recommendations: int = option(
        10,
        help="trials in all",
        flag="--trials",
        rest=True,
        rest_aliases=("automl_max_recommendations", "trials"),
        ge=1,
        le=MAX_TRIALS,
        cli_default=8,
        cli={"metavar": "TRIALS"},
    )
    max_concurrent: int = option(
        1,
        help="trials at once (the command line's threads, the service's train jobs queued "
        "or running)",
        flag="--parallel",
        rest=True,
        rest_aliases=("automl_max_concurrent", "parallel"),
        ge=1,
        le=MAX_CONCURRENT_TRIALS,
        cli={"metavar": "PARALLEL"},
    )
    metric: str = option(
        DEFAULT_METRIC,
        help="the validation metric to maximise (a loss, e.g. 'val/Total loss', is minimised)",
        rest=True,
        pattern=r"^[A-Za-z0-9_/ .-]{1,100}$",
    )
    pruner: PrunerName | None = option(
        None,
        help="the pruner instead of the algorithm's (bayesian's and random's: median; "
        "hyperband's and asha's: their own)",
        rest=True,
        cli_default="",
    )
    reduction_factor: int = option(
        3,
        help="Hyperband / ASHA's eta: the share of trials promoted at each rung is 1/eta",
        rest=True,
        rest_aliases=("automl_nu",),
        ge=2,
        le=10,
    )
    seed: int | None = option(None, help="the sampler's seed", rest=True, ge=0, le=2**31 - 1)
