"""One definition of the prune options: the engine's PruneOptions, the ``maskops prune``
flags and the REST prune job's options agree on names, choices and defaults, and run_prune
takes the options only through the engine's object."""

from __future__ import annotations

import inspect
from dataclasses import fields, replace
from typing import Any, get_type_hints

from maskops.cli import prune as cli_prune
from maskops.prune.options import DEFAULTS, PruneOptions, cli_flag
from maskops.prune.run import run_prune
from maskops_core.options import PruneOptions as JobPruneOptions
from tests.support.options_agreement import TaskCli, literals

BASE = ["prune", "-m", "model.pth", "-o", "out"]
OTHER_VALUES: dict[str, Any] = {
    "norm": "L2",
    "equalization": "intersection",
    "granularity": 4,
    "threshold": 0.5,
    "min_filters": 8,
    "excluded_layers": ("backbone.body.layer4",),
}
"""A value other than the default for every option."""
CLI = TaskCli(BASE, cli_prune.prune_options, DEFAULTS, cli_flag, OTHER_VALUES)


def test_the_job_options_are_engine_options_with_the_engine_defaults() -> None:
    job_fields = set(JobPruneOptions.model_fields) - set(JobPruneOptions.SOURCE_FIELDS)
    engine_types = get_type_hints(PruneOptions)
    assert job_fields == set(engine_types), job_fields ^ set(engine_types)
    defaults = JobPruneOptions.model_validate({})
    for name in job_fields:
        job_field = JobPruneOptions.model_fields[name]
        # A list in the job (JSON), a tuple in the engine's frozen object.
        default = getattr(defaults, name)
        assert (tuple(default) if isinstance(default, list) else default) == getattr(
            DEFAULTS, name
        ), name
        assert literals(job_field.annotation) == literals(engine_types[name]), name
    assert literals(engine_types["norm"]) == {"max", "L2"}


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
