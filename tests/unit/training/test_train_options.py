"""The train options: TAO's process flags are one option, a job's options become the
engine's unchanged, and options that cannot run name their flag."""

from __future__ import annotations

from dataclasses import replace

import pytest

from maskops.cli import train as cli_train
from maskops.cli.main import build_parser
from maskops.training.train_options import DEFAULTS, TrainOptions
from maskops_core.options import TrainOptions as JobTrainOptions

BASE = ["train", "-e", "spec.txt", "-d", "results"]


def _cli_options(*flags: str) -> TrainOptions:
    return cli_train.train_options(build_parser().parse_args([*BASE, *flags]))


def test_tao_s_process_flags_are_the_same_option() -> None:
    assert _cli_options("-np", "3") == _cli_options("--num_processes", "3")
    assert _cli_options("-np", "3") == replace(DEFAULTS, gpus=3)


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
