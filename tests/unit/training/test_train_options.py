"""One definition of the train options: the engine's TrainOptions, the ``maskops train``
flags and the REST train job's options agree on names and defaults, and a job's options
become the engine's unchanged."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest

from maskops.cli import train as cli_train
from maskops.training.train_options import DEFAULTS, TrainOptions, cli_flag
from maskops_core.options import TrainOptions as JobTrainOptions
from tests.support.options_agreement import TaskCli

BASE = ["train", "-e", "spec.txt", "-d", "results"]
OTHER_VALUES: dict[str, Any] = {
    "gpus": 4,
    "gpu_index": 2,
    "nodes": 2,
    "rdzv_endpoint": "head:29400",
    "rdzv_id": "run-7",
    "max_restarts": 3,
    "use_amp": True,
}
"""A value other than the default for every option."""
CLI = TaskCli(BASE, cli_train.train_options, DEFAULTS, cli_flag, OTHER_VALUES)


def test_tao_s_process_flags_are_the_same_option() -> None:
    assert CLI.options("-np", "3") == CLI.options("--num_processes", "3")
    assert CLI.options("-np", "3") == replace(DEFAULTS, gpus=3)


def test_the_job_options_are_engine_options_with_the_engine_defaults() -> None:
    engine_names = {f.name for f in fields(TrainOptions)}
    job_fields = set(JobTrainOptions.model_fields) - {"trial"}
    assert job_fields <= engine_names, job_fields - engine_names
    for name in job_fields:
        assert JobTrainOptions.model_fields[name].default == getattr(DEFAULTS, name), name


def test_a_job_s_options_become_engine_options_unchanged() -> None:
    job = JobTrainOptions.model_validate({"gpus": 2, "nodes": 3, "gpu_index": 1})
    run = job.engine(rdzv_endpoint="w1:4000", max_restarts=2)
    assert run == replace(
        DEFAULTS, gpus=2, nodes=3, gpu_index=1, rdzv_endpoint="w1:4000", max_restarts=2
    )
    assert JobTrainOptions.model_validate({}).engine() == DEFAULTS
    assert DEFAULTS.in_process and not run.in_process


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--gpus", "0"], "--gpus must be >= 1, got 0"),
        (["--max_restarts", "-1"], "--max_restarts must be >= 0, got -1"),
        (["--nnodes", "0"], "--nnodes must be >= 1, got 0"),
        (["--nnodes", "2"], "--nnodes 2 needs --rdzv_endpoint HOST:PORT"),
    ],
)
def test_options_that_cannot_run_name_the_flag(flags: list[str], problem: str) -> None:
    assert CLI.options(*flags).problem() == problem
