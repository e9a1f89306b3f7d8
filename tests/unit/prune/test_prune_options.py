"""The prune options: a job's options become the engine's PruneOptions unchanged, and
run_prune takes the options only through the engine's object."""

from __future__ import annotations

import inspect
from dataclasses import fields, replace
from typing import Any

from maskops.prune.options import DEFAULTS, PruneOptions
from maskops.prune.run import run_prune
from maskops_core.options import PruneOptions as JobPruneOptions

OTHER_VALUES: dict[str, Any] = {
    "norm": "L2",
    "equalization": "intersection",
    "granularity": 4,
    "threshold": 0.5,
    "min_filters": 8,
    "excluded_layers": ("backbone.body.layer4",),
}
"""A value other than the default for every option."""


def test_a_job_s_options_become_engine_options_unchanged() -> None:
    chosen: dict[str, Any] = {k: v for k, v in OTHER_VALUES.items() if k != "excluded_layers"}
    job = JobPruneOptions.model_validate({"checkpoint": "latest", **chosen})
    given = job.given(exclude={*job.SOURCE_FIELDS, "excluded_layers"})
    assert replace(DEFAULTS, **given) == replace(DEFAULTS, **chosen)
    assert replace(DEFAULTS, **JobPruneOptions.model_validate({}).given()) == DEFAULTS


def test_run_prune_takes_options_only_through_the_engine_object() -> None:
    parameters = set(inspect.signature(run_prune).parameters)
    assert "options" in parameters
    assert not parameters & {f.name for f in fields(PruneOptions)}
