"""``maskops train -e SPEC -d RESULTS_DIR [--gpus N] [--gpu_index I] [--use_amp] [--log_file F]``.

Running the same command again with the same RESULTS_DIR resumes from its newest
checkpoint. Ctrl-C (or SIGTERM) stops at the next step boundary and saves a checkpoint; a
second Ctrl-C interrupts at once. ``--gpus N`` (TAO's ``-np/--num_processes`` too) starts N
ranks under torchrun (:mod:`maskops.training.launcher`); ``--max_restarts`` restarts them
from the last checkpoint when one crashes; ``--nnodes M --rdzv_endpoint HOST:PORT
--rdzv_id RUN``, given on each of M hosts, makes them one run.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from maskops.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CLIError,
    add_key_argument,
    add_spec_argument,
    load_resolved_spec,
)
from maskops.cli.options import add_option_flags, options_from_args
from maskops.tasks import TRAIN
from maskops.training.train_options import TrainOptions

if TYPE_CHECKING:
    from maskops.spec.models import ExperimentSpec
    from maskops.training import TrainResult


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "train",
        help=TRAIN.summary,
        description=(
            "Train the spec's Mask R-CNN on data_config.training_file_pattern, checkpointing "
            "and validating every num_steps_per_eval steps into RESULTS_DIR. Rerunning the "
            "same command resumes from the last checkpoint."
        ),
    )
    add_spec_argument(parser)
    parser.add_argument(
        "-d",
        "--results_dir",
        "--model_dir",
        required=True,
        type=Path,
        help="checkpoints, logs, status.json",
    )
    add_option_flags(parser, TrainOptions)
    parser.add_argument("--log_file", type=Path, default=None, help="also write the log here")
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def _graceful_stop() -> threading.Event:
    """An event set by the first SIGINT/SIGTERM; a second SIGINT interrupts immediately."""
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()
        print(
            "maskops train: stopping at the next step and saving a checkpoint "
            "(Ctrl-C again to abort)",
            file=sys.stderr,
        )

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)
    return stop


def _log_above_the_bar() -> AbstractContextManager[object]:
    """On a terminal, log lines go through tqdm, which writes each above the progress bar
    and redraws it, so the bar stays one whole line; elsewhere (no bar) nothing changes."""
    if not sys.stderr.isatty():
        return nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()


def train_options(args: argparse.Namespace) -> TrainOptions:
    """The engine's options from the parsed flags."""
    return options_from_args(args, TrainOptions)


def training_spec(args: argparse.Namespace) -> ExperimentSpec:
    """The spec to train: the file's, paths resolved, with ``--use_amp`` applied."""
    spec = load_resolved_spec(args.experiment_spec)
    if args.use_amp:
        spec = spec.model_copy(update={"use_amp": True})
    return spec


def run(args: argparse.Namespace) -> int:
    from maskops.training import (
        NonFiniteLossError,
        RankFailed,
        TrainingCancelled,
        TrainingError,
    )

    spec = training_spec(args)
    options = train_options(args)
    if (problem := options.problem()) is not None:
        raise CLIError(problem)
    if args.log_file is not None:
        args.log_file.parent.mkdir(parents=True, exist_ok=True)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    stop = _graceful_stop()
    try:
        with _log_above_the_bar():
            result = _train(spec, options, args.results_dir, args.log_file, stop)
    except (NonFiniteLossError, RankFailed) as exc:
        # The run itself failed (exit 1); any other TrainingError is bad input (exit 2).
        raise CLIError(str(exc), exit_code=EXIT_FAILURE) from None
    except TrainingError as exc:
        raise CLIError(str(exc)) from None
    except TrainingCancelled as exc:
        print(f"maskops train: {exc}; rerun the same command to resume", file=sys.stderr)
        return EXIT_FAILURE
    ended = f" ({result.stop_reason})" if result.stop_reason else ""
    print(f"training finished at step {result.step}/{result.total_steps}{ended}")
    print(f"checkpoint: {result.checkpoint}")
    return EXIT_OK


def _train(
    spec: ExperimentSpec,
    options: TrainOptions,
    results_dir: Path,
    log_file: Path | None,
    stop: threading.Event,
) -> TrainResult:
    """In this process for one rank on one host; otherwise through torchrun (the one
    launcher), also for one host of several."""
    from maskops.training import CancelHook, run_training
    from maskops.training.launcher import RankPlan, train_under_torchrun

    if options.in_process:
        return run_training(
            spec,
            results_dir,
            gpu_index=options.gpu_index,
            log_file=log_file,
            extra_hooks=[CancelHook(stop.is_set)],
        )
    plan = RankPlan(
        nproc_per_node=options.gpus,
        nnodes=options.nodes,
        rdzv_endpoint=options.rdzv_endpoint,
        rdzv_id=options.rdzv_id,
        max_restarts=options.max_restarts,
        gpu_index=options.gpu_index,
    )
    return train_under_torchrun(spec, results_dir, plan, log_file=log_file, should_stop=stop.is_set)
