"""One definition of the evaluate options: the engine's EvaluateOptions, the ``maskops
evaluate`` flags and the REST evaluate job's options agree on names and defaults, and
run_evaluation takes the options only through the engine's object."""

from __future__ import annotations

import inspect
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from maskops.cli import evaluate as cli_evaluate
from maskops.evaluation.options import DEFAULTS, EvaluateOptions, cli_flag
from maskops.evaluation.runner import run_evaluation
from maskops.spec.text import parse_spec_text
from maskops_core.options import EvaluateOptions as JobEvaluateOptions
from tests.support.options_agreement import TaskCli

BASE = ["evaluate", "-e", "spec.txt", "-m", "model.pth"]
OTHER_VALUES: dict[str, Any] = {"gpu_index": 1, "image_dir": Path("images")}
"""A value other than the default for every option."""
SPEC_WITHOUT_SHARDS = parse_spec_text('data_config { val_json_file: "val.json" }')
"""A spec whose validation images come from ``-i`` (no validation shards)."""
CLI = TaskCli(
    BASE,
    lambda args: cli_evaluate.evaluate_options(args, SPEC_WITHOUT_SHARDS),
    DEFAULTS,
    cli_flag,
    OTHER_VALUES,
)


def test_the_job_options_are_engine_options_with_the_engine_defaults() -> None:
    job_fields = set(JobEvaluateOptions.model_fields) - set(JobEvaluateOptions.SOURCE_FIELDS)
    assert job_fields <= set(OTHER_VALUES), job_fields - set(OTHER_VALUES)
    for name in job_fields:
        assert JobEvaluateOptions.model_fields[name].default == getattr(DEFAULTS, name), name


def test_a_job_s_options_become_engine_options_unchanged() -> None:
    job = JobEvaluateOptions.model_validate({"checkpoint": "latest", "gpu_index": 1})
    given = job.given(exclude=set(job.SOURCE_FIELDS))
    assert replace(DEFAULTS, **given) == replace(DEFAULTS, gpu_index=1)
    assert replace(DEFAULTS, **JobEvaluateOptions.model_validate({}).given()) == DEFAULTS


def test_run_evaluation_takes_options_only_through_the_engine_object() -> None:
    parameters = set(inspect.signature(run_evaluation).parameters)
    assert "options" in parameters
    assert not parameters & {f.name for f in fields(EvaluateOptions)}
