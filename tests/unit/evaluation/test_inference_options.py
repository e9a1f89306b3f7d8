"""One definition of the inference options: the engine's InferenceOptions, the ``maskops
inference`` flags and the REST inference job's options agree on names and defaults (a job
draws masks by default), and run_inference takes the options only through the engine's
object."""

from __future__ import annotations

import inspect
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from maskops.cli import inference as cli_inference
from maskops.evaluation.inference import run_inference
from maskops.evaluation.inference_options import DEFAULTS, InferenceOptions, cli_flag
from maskops_core.options import InferenceOptions as JobInferenceOptions
from tests.support.options_agreement import TaskCli

BASE = ["inference", "-i", "images", "-o", "out", "-e", "spec.txt", "-m", "model.pth"]
OTHER_VALUES: dict[str, Any] = {
    "threshold": 0.25,
    "include_mask": True,
    "gpu_index": 1,
    "annotations": Path("val.json"),
}
"""A value other than the default for every option."""
JOB_ONLY = {"image_dir", "exports", "polygon_tolerance", "model_version"}
"""Job options that are not the inference's: its input images (the CLI's positional -i) and
the labelling tools' files written after it."""
JOB_DEFAULTS = {"include_mask": True}
"""Where a job's default differs from the engine's and the CLI's: it draws masks."""
CLI = TaskCli(BASE, cli_inference.inference_options, DEFAULTS, cli_flag, OTHER_VALUES)


def test_the_job_options_are_engine_options_with_the_engine_defaults() -> None:
    job_fields = set(JobInferenceOptions.model_fields) - set(JobInferenceOptions.SOURCE_FIELDS)
    engine_fields = {f.name for f in fields(InferenceOptions)}
    assert job_fields - JOB_ONLY <= engine_fields, job_fields - JOB_ONLY - engine_fields
    for name in job_fields - JOB_ONLY:
        expected = JOB_DEFAULTS.get(name, getattr(DEFAULTS, name))
        assert JobInferenceOptions.model_fields[name].default == expected, name


def test_a_job_s_options_become_engine_options_unchanged() -> None:
    chosen: dict[str, Any] = {"threshold": 0.25, "include_mask": False, "gpu_index": 1}
    job = JobInferenceOptions.model_validate({"checkpoint": "latest", **chosen})
    given = job.given(exclude={*job.SOURCE_FIELDS, *JOB_ONLY})
    assert replace(DEFAULTS, **given) == replace(DEFAULTS, **chosen)


def test_run_inference_takes_options_only_through_the_engine_object() -> None:
    parameters = set(inspect.signature(run_inference).parameters)
    assert "options" in parameters
    assert not parameters & {f.name for f in fields(InferenceOptions)}
