"""The inference options: a job's options become the engine's InferenceOptions unchanged,
and run_inference takes the options only through the engine's object."""

from __future__ import annotations

import inspect
from dataclasses import fields, replace
from typing import Any

from maskops.evaluation.inference import run_inference
from maskops.evaluation.inference_options import DEFAULTS, InferenceOptions
from maskops_core.options import InferenceOptions as JobInferenceOptions

JOB_ONLY = {"image_dir", "exports", "polygon_tolerance", "model_version"}
"""Job options that are not the inference run's: its input images (the CLI's -i) and the
labelling tools' files written after it."""


def test_a_job_s_options_become_engine_options_unchanged() -> None:
    chosen: dict[str, Any] = {"threshold": 0.25, "include_mask": False, "gpu_index": 1}
    job = JobInferenceOptions.model_validate({"checkpoint": "latest", **chosen})
    given = job.given(exclude={*job.SOURCE_FIELDS, *JOB_ONLY})
    assert replace(DEFAULTS, **given) == replace(DEFAULTS, **chosen)


def test_run_inference_takes_options_only_through_the_engine_object() -> None:
    parameters = set(inspect.signature(run_inference).parameters)
    assert "options" in parameters
    assert not parameters & {f.name for f in fields(InferenceOptions)}
