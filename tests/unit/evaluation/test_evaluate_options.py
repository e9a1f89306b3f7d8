"""The evaluate options: a job's options become the engine's EvaluateOptions unchanged, and
run_evaluation takes the options only through the engine's object."""

from __future__ import annotations

import inspect
from dataclasses import fields, replace

from maskops.evaluation.options import DEFAULTS, EvaluateOptions
from maskops.evaluation.runner import run_evaluation
from maskops_core.options import EvaluateOptions as JobEvaluateOptions


def test_a_job_s_options_become_engine_options_unchanged() -> None:
    job = JobEvaluateOptions.model_validate({"checkpoint": "latest", "gpu_index": 1})
    given = job.given(exclude=set(job.SOURCE_FIELDS))
    assert replace(DEFAULTS, **given) == replace(DEFAULTS, gpu_index=1)
    assert replace(DEFAULTS, **JobEvaluateOptions.model_validate({}).given()) == DEFAULTS


def test_run_evaluation_takes_options_only_through_the_engine_object() -> None:
    parameters = set(inspect.signature(run_evaluation).parameters)
    assert "options" in parameters
    assert not parameters & {f.name for f in fields(EvaluateOptions)}
