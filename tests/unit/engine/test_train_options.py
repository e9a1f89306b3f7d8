"""One definition of the train options: the engine's TrainOptions, the ``maskops train``
flags and the REST train job's options agree on names and defaults, and a job's options
become the engine's unchanged."""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from typing import Any

import pytest

from maskops.cli import train as cli_train
from maskops.cli.main import build_parser
from maskops.engine.train_options import DEFAULTS, TrainOptions, cli_flag
from maskops_core.options import TrainOptions as JobTrainOptions

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


def _cli_options(*flags: str) -> TrainOptions:
    args: argparse.Namespace = build_parser().parse_args([*BASE, *flags])
    return cli_train.train_options(args)


def test_other_values_cover_every_option() -> None:
    assert set(OTHER_VALUES) == {f.name for f in fields(TrainOptions)}
    assert all(getattr(DEFAULTS, k) != v for k, v in OTHER_VALUES.items())


def test_the_cli_defaults_are_the_engine_defaults() -> None:
    assert _cli_options() == DEFAULTS


@pytest.mark.parametrize("name", sorted(OTHER_VALUES))
def test_each_option_has_its_cli_flag(name: str) -> None:
    value = OTHER_VALUES[name]
    flags = [cli_flag(name)] if value is True else [cli_flag(name), str(value)]
    assert _cli_options(*flags) == replace(DEFAULTS, **{name: value})


def test_tao_s_process_flags_are_the_same_option() -> None:
    assert _cli_options("-np", "3") == _cli_options("--num_processes", "3")
    assert _cli_options("-np", "3") == replace(DEFAULTS, gpus=3)


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
    assert _cli_options(*flags).problem() == problem
