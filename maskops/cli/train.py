"""``maskops train -e SPEC -d RESULTS_DIR [--gpus N] [--gpu_index I [J ...]] [--use_amp]
[--log_file F]``.

Running the same command again with the same RESULTS_DIR resumes from its newest
checkpoint. Ctrl-C (or SIGTERM) stops at the next step boundary and saves a checkpoint; a
second Ctrl-C interrupts at once. ``--gpus N`` (TAO's ``-np/--num_processes`` too) starts N
ranks under torchrun (:mod:`maskops.training.launcher`); ``--max_restarts`` restarts them
from the last checkpoint when one crashes; ``--nnodes M --rdzv_endpoint HOST:PORT
--rdzv_id RUN``, given on each of M hosts, makes them one run. ``--gpu_index`` takes the
first GPU of the ranks or, as TAO's launcher, one index per rank (:func:`gpu_selection`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
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
    add_option_flags(
        parser,
        TrainOptions,
        keywords={"gpu_index": {"nargs": "+", "metavar": "I"}},
    )
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


def gpu_selection(
    indices: int | Sequence[int], gpus: int, visible: str | None
) -> tuple[int, str | None]:
    """TAO's ``--gpu_index I [J ...]`` as the first CUDA device of the ranks (rank ``r`` of
    a host takes ``first + r``) and the ``CUDA_VISIBLE_DEVICES`` to set first (None: leave
    it as it is); ``visible`` is its present value.

    One index is the first device. Several are, as TAO's launcher reads them, the devices
    of the ranks, as many as ``gpus``, in any order: consecutive ones are their first,
    others become the only visible devices (picked from ``visible`` where it is set, whose
    numbering CUDA then uses). Raises :class:`CLIError` naming the flags."""
    if isinstance(indices, int):
        return indices, None
    if len(indices) == 1:
        return indices[0], None
    chosen = sorted(set(indices))
    listed = " ".join(map(str, indices))
    if len(chosen) != gpus:
        raise CLIError(
            f"--gpu_index {listed} names {len(chosen)} GPU(s) but --gpus is {gpus}: give one "
            "index per rank, or only the first"
        )
    if chosen[0] < 0:
        raise CLIError(f"--gpu_index {listed}: indices must be >= 0")
    if chosen == list(range(chosen[0], chosen[0] + gpus)):
        return chosen[0], None
    devices = [d.strip() for d in visible.split(",")] if visible else None
    if devices is not None and chosen[-1] >= len(devices):
        raise CLIError(
            f"--gpu_index {listed}: CUDA_VISIBLE_DEVICES={visible} makes only "
            f"{len(devices)} GPU(s) visible"
        )
    names = [devices[i] if devices is not None else str(i) for i in chosen]
    return 0, ",".join(names)


def _first_gpu_and_visible(args: argparse.Namespace) -> tuple[int, str | None]:
    return gpu_selection(args.gpu_index, args.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


def train_options(args: argparse.Namespace) -> TrainOptions:
    """The engine's options from the parsed flags."""
    first, _ = _first_gpu_and_visible(args)
    return options_from_args(argparse.Namespace(**{**vars(args), "gpu_index": first}), TrainOptions)


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
    _, visible = _first_gpu_and_visible(args)
    if visible is not None:
        # As TAO's launcher does: the ranks (and torchrun) see only the GPUs named.
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
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
