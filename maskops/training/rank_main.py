"""One training rank under torchrun: ``python -m maskops.training.rank_main --spec S
--results_dir D [--cancel_file F] [--gpu_index I] [--log_file L] [--log_every N]
[--init_timeout_s T] [--collective_timeout_s T] [--evaluation_timeout_s T]``.

torchrun (:mod:`maskops.training.launcher`) starts this once per rank with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous in the environment. Rank 0 writes the
checkpoints, logs and ``status.json`` as a one-process run does; a rank that fails records
its error in ``launch/rank-<R>.error`` (for the parent's report) and exits non-zero, which
makes torchrun stop or restart the whole group. A cancelled run exits 0: ``status.json``
says ``cancelled``.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from maskops.spec.models import ExperimentSpec
from maskops.training.distributed import GroupTimeouts, torchrun_env
from maskops.training.errors import NonFiniteLossError, TrainingCancelled, TrainingError
from maskops.training.hooks import CancelHook, write_json_atomic
from maskops.training.launcher import ERROR_SUFFIX, LAUNCH_DIR, TORCHRUN_ENVIRONMENT
from maskops.training.train import train_this_rank

logger = logging.getLogger("maskops.train")

RESTART_VARIABLE = "TORCHELASTIC_RESTART_COUNT"
"""Set by torchrun: how many times it has restarted the group."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m maskops.training.rank_main")
    parser.add_argument("--spec", type=Path, required=True, help="spec file (text or JSON)")
    parser.add_argument("--results_dir", type=Path, required=True)
    parser.add_argument("--cancel_file", type=Path, default=None, help="stop when it exists")
    parser.add_argument("--gpu_index", type=int, default=0)
    parser.add_argument("--log_file", type=Path, default=None)
    parser.add_argument("--log_every", type=int, default=None)
    parser.add_argument(
        "--init_timeout_s",
        type=float,
        default=GroupTimeouts.init_s,
        help="seconds the ranks wait for each other to form the group",
    )
    parser.add_argument(
        "--collective_timeout_s",
        type=float,
        default=GroupTimeouts.collective_s,
        help="seconds a rank waits for the others in one collective",
    )
    parser.add_argument(
        "--evaluation_timeout_s",
        type=float,
        default=GroupTimeouts.evaluation_s,
        help="seconds a rank waits for the others in one collective of an evaluation",
    )
    return parser


def record_error(results_dir: Path, rank: int, exc: BaseException) -> None:
    """``launch/rank-<R>.error``: this rank's one-line error for the parent's report."""
    input_error = isinstance(exc, TrainingError) and not isinstance(exc, NonFiniteLossError)
    text = " ".join(str(exc).split()) or type(exc).__name__
    path = results_dir / LAUNCH_DIR / f"rank-{rank}{ERROR_SUFFIX}"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        path,
        {
            "rank": rank,
            "error": text if isinstance(exc, TrainingError) else f"{type(exc).__name__}: {text}",
            "input_error": input_error,
            "attempt": int(os.environ.get(RESTART_VARIABLE, "0")),
            "time": time.time(),
        },
    )


def _load_spec(path: Path) -> ExperimentSpec:
    """A TAO text or JSON spec, relative paths resolved against its folder (as the CLI)."""
    from maskops.spec import SpecError, load_spec

    try:
        return load_spec(path).resolve_paths(path.parent)
    except SpecError as exc:
        raise TrainingError(str(exc)) from None


def warn_of_a_shared_store() -> None:
    """A torchrun started without :data:`~maskops.training.launcher.TORCHRUN_ENVIRONMENT`
    (by hand, Kubernetes, Slurm) that may restart the ranks: say what a restart risks."""
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if shared and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
        setting = " ".join(f"{k}={v}" for k, v in TORCHRUN_ENVIRONMENT.items())
        logger.warning(
            "the ranks form their group on torchrun's own store, which keeps the previous "
            "group's addresses: a restarted group may fail to form (within the init "
            "timeout); run torchrun with %s",
            setting,
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    rank = (torchrun_env() or (0, 1, 0))[0]
    restarts = int(os.environ.get(RESTART_VARIABLE, "0"))
    if restarts and rank == 0:
        # Also in the job's log: the group was restarted and resumes from its checkpoint.
        logger.warning("torchrun restarted the ranks (restart %d): resuming", restarts)
    if rank == 0 and not restarts:
        warn_of_a_shared_store()
    try:
        spec = _load_spec(args.spec)
        hooks = [CancelHook.on_file(args.cancel_file)] if args.cancel_file else []
        train_this_rank(
            spec,
            args.results_dir,
            gpu_index=args.gpu_index,
            log_file=args.log_file if rank == 0 else None,
            extra_hooks=hooks,  # rank 0 runs them; every rank's evaluation polls the cancel
            log_every=args.log_every,
            timeouts=GroupTimeouts(
                args.init_timeout_s, args.collective_timeout_s, args.evaluation_timeout_s
            ),
        )
    except TrainingCancelled as exc:
        logger.info("%s", exc)
    except Exception as exc:
        record_error(args.results_dir, rank, exc)
        logger.exception("rank %d failed: %s", rank, exc)
        return 1
    return 0


def exit_before_finalization(code: int) -> NoReturn:
    """End the process with ``code`` after the atexit handlers (logging flushed, trackers
    closed) but without the interpreter's finalization.

    gloo's worker threads outlive ``destroy_process_group``: a DistributedDataParallel
    keeps its group alive in C++. A worker that drops the last reference to a tensor
    Python created takes the GIL to free it; during finalization that ends the thread and
    the rank aborts ("terminate called without an active exception", SIGABRT) after a run
    that succeeded (torch 2.14, two gloo ranks on a 2-core host with two busy processes
    beside them: 3 runs in 20, 2026-11-26). Unreachable objects are collected first, so
    that DataLoader iterators stop their worker processes.
    """
    gc.collect()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_before_finalization(main())
