"""The one way maskops starts training ranks: torch.distributed elastic (``torchrun``).

:func:`torchrun_command` builds ``python -m torch.distributed.run ... -m
maskops.training.rank_main ...`` for one host (``--standalone``) or one host of several (a
c10d rendezvous named after the job); :func:`train_under_torchrun` runs it as a child
process and watches it. The CLI (``maskops train --gpus N``) and the Celery train task both
go through it; Kubernetes and Slurm run the same command (docs/operations.md).

The parent and the ranks share only files in the results directory:

* ``launch/spec.json``: the resolved spec every rank trains;
* ``launch/cancel``: created by the parent to stop the run; rank 0 sees it at the next step
  boundary, the ranks agree, rank 0 saves the checkpoint of that step and all exit (every
  rank also sees it between two batches of an evaluation, which is then abandoned);
* ``status.json``: rank 0's state, step, metrics and last checkpoint (``StatusHook``), read
  for progress and for the outcome;
* ``launch/rank-<R>.error``: a rank's one-line error, for the failure the parent reports.

A rank that crashes fails the whole group: torchrun restarts every rank (up to
``max_restarts``) and they resume from the last checkpoint, which rank 0 logs. torchrun runs
with :data:`TORCHRUN_ENVIRONMENT`, so that each restarted group forms on a store of its own.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from maskops.spec.models import ExperimentSpec
from maskops.training.distributed import GroupTimeouts
from maskops.training.errors import (
    RankFailed,
    RendezvousFailed,
    TrainingCancelled,
    TrainingError,
)
from maskops.training.results import STATUS_FILE, TrainResult

logger = logging.getLogger("maskops.train")

LAUNCH_DIR = "launch"
SPEC_FILE = "spec.json"
CANCEL_FILE = "cancel"
ERROR_SUFFIX = ".error"
RANK_MODULE = "maskops.training.rank_main"
TORCHRUN_ENVIRONMENT = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""Set for torchrun. By default the ranks form their group on the agent's store, which
outlives the group: a restarted group found the dead group's addresses there (gloo's
``default_pg/0//cpu//0/R`` keys), and a rank that read its peer's before the peer rewrote
it connected to a dead port, then retried until the timeout (the restarted group hung).
With this, rank 0 of each (re)started group serves a new store on a new port."""

Status = dict[str, Any]


@dataclass(frozen=True)
class RankPlan:
    """How many ranks, on how many hosts, and how torchrun gathers and restarts them."""

    nproc_per_node: int = 1
    nnodes: int = 1
    rdzv_endpoint: str = ""
    """``host:port`` of the c10d rendezvous (several hosts); empty: ``--standalone``."""
    rdzv_id: str = "maskops"
    """Names the run: every host of one job passes the same id."""
    hosts_rendezvous: bool | None = None
    """Whether this host serves the rendezvous store at ``rdzv_endpoint`` (the host it
    names); None: torchrun guesses from the host name, so hosts sharing one name (loopback)
    race for it."""
    max_restarts: int = 0
    join_timeout_s: float = 600.0
    """How long the hosts may take to gather before torchrun gives up."""
    gpu_index: int = 0
    timeouts: GroupTimeouts = field(default_factory=GroupTimeouts)
    """How long the ranks wait for each other to form the group, and in a collective."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise TrainingError(
                f"ranks per host and hosts must be >= 1, got {self.nproc_per_node} x {self.nnodes}"
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise TrainingError(f"{self.nnodes} hosts need a rendezvous endpoint (host:port)")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def torchrun_command(
    plan: RankPlan, rank_args: list[str], *, module: str = RANK_MODULE
) -> list[str]:
    """The torchrun command line running ``module`` (:mod:`maskops.training.rank_main`) with
    ``rank_args``; run it with :func:`torchrun_environment`."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={plan.nproc_per_node}",
        f"--max-restarts={plan.max_restarts}",
        "--monitor-interval=1",
    ]
    if plan.rdzv_endpoint:
        command += [
            f"--nnodes={plan.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={plan.rdzv_endpoint}",
            f"--rdzv-id={plan.rdzv_id}",
            f"--rdzv-conf=join_timeout={plan.join_timeout_s:g}{_is_host(plan)}",
        ]
    else:
        command.append("--standalone")
    return [*command, "-m", module, *rank_args]


def _is_host(plan: RankPlan) -> str:
    """The ``--rdzv-conf`` option naming the host of the rendezvous store, if known."""
    return "" if plan.hosts_rendezvous is None else f",is_host={int(plan.hosts_rendezvous)}"


def torchrun_environment() -> dict[str, str]:
    """This process's environment with :data:`TORCHRUN_ENVIRONMENT`."""
    return {**os.environ, **TORCHRUN_ENVIRONMENT}


def rank_arguments(
    results_dir: Path, plan: RankPlan, *, log_file: Path | None, log_every: int | None
) -> list[str]:
    """The arguments of :mod:`maskops.training.rank_main` for a run in ``results_dir``."""
    launch_dir = results_dir / LAUNCH_DIR
    args = [
        "--spec",
        str(launch_dir / SPEC_FILE),
        "--results_dir",
        str(results_dir),
        "--cancel_file",
        str(launch_dir / CANCEL_FILE),
        "--gpu_index",
        str(plan.gpu_index),
        "--init_timeout_s",
        f"{plan.timeouts.init_s:g}",
        "--collective_timeout_s",
        f"{plan.timeouts.collective_s:g}",
        "--evaluation_timeout_s",
        f"{plan.timeouts.evaluation_s:g}",
    ]
    if log_file is not None:
        args += ["--log_file", str(log_file)]
    if log_every is not None:
        args += ["--log_every", str(log_every)]
    return args


def prepare_run(spec: ExperimentSpec, results_dir: Path) -> None:
    """Write the spec the ranks read and clear the previous run's cancel flag and errors."""
    launch_dir = results_dir / LAUNCH_DIR
    launch_dir.mkdir(parents=True, exist_ok=True)
    (launch_dir / CANCEL_FILE).unlink(missing_ok=True)
    for old in launch_dir.glob(f"*{ERROR_SUFFIX}"):
        old.unlink()
    # Only the fields the spec sets: a field left unset (n_workers) stays unset for the ranks.
    (launch_dir / SPEC_FILE).write_text(spec.model_dump_json(exclude_unset=True))


def train_under_torchrun(
    spec: ExperimentSpec,
    results_dir: Path,
    plan: RankPlan,
    *,
    log_file: Path | None = None,
    log_every: int | None = None,
    output: IO[bytes] | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_status: Callable[[Status], None] | None = None,
    poll_s: float = 0.5,
    stop_grace_s: float = 300.0,
) -> TrainResult:
    """Train with ``plan``'s ranks under torchrun and return rank 0's ``TrainResult``.

    ``output``: where torchrun and the ranks write stdout/stderr (default: this process's).
    ``should_stop``: polled; once true, the run stops at the next step boundary with a
    checkpoint (every rank is killed if it takes longer than ``stop_grace_s``).
    ``on_status``: called with rank 0's ``status.json`` whenever it changes.

    Raises:
        TrainingError: bad input, as rank 0 reported it.
        RendezvousFailed: the hosts of a several-host plan did not gather in time, at the
            start or when torchrun restarted the group after a host left.
        RankFailed: a rank failed and torchrun's restarts are spent (its error).
        TrainingCancelled: stopped on request; its checkpoint holds the last step.
    """
    results_dir = Path(results_dir)
    prepare_run(spec, results_dir)
    args = rank_arguments(results_dir, plan, log_file=log_file, log_every=log_every)
    command = torchrun_command(plan, args)
    started = time.time()
    logger.info("starting %d rank(s): %s", plan.nproc_per_node, " ".join(command))
    # A session of its own: a terminal's Ctrl-C reaches the parent only, which stops the
    # ranks through the cancel flag (and, as a last resort, the whole group by its id).
    process = subprocess.Popen(
        command,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        env=torchrun_environment(),
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    watcher = _Watcher(process, results_dir, should_stop, on_status, stop_grace_s)
    try:
        while process.poll() is None:
            watcher.poll()
            time.sleep(poll_s)
        watcher.poll()
    finally:
        stop_process_group(process)
    if process.returncode != 0 and plan.nnodes > 1 and not watcher.killed:
        missing = _hosts_missing(plan, results_dir, started)
        if missing:
            raise RendezvousFailed(missing)
    return outcome(process.returncode, results_dir, killed=watcher.killed)


def _hosts_missing(plan: RankPlan, results_dir: Path, since: float) -> str | None:
    """Why a several-host run that failed was short of hosts, if it was: none gathered,
    or a host left (its ranks' peers failed and torchrun restarted the group, which found
    too few hosts: the errors are older than the restarts torchrun had left)."""
    gather = (
        f"the {plan.nnodes} hosts did not gather within {plan.join_timeout_s:g} s at "
        f"{plan.rdzv_endpoint} (rendezvous {plan.rdzv_id})"
    )
    if not _ranks_ran(results_dir, since):
        return f"{gather}: no rank started"
    if read_status(results_dir).get("state") in ("succeeded", "stopped", "cancelled"):
        return None
    errors = rank_errors(results_dir)
    last = errors[0] if errors else None
    if last and not last.get("input_error") and int(last.get("attempt", 0)) < plan.max_restarts:
        return f"{gather} after a host left the run (rank {last['rank']}: {last['error']})"
    return None


def _ranks_ran(results_dir: Path, since: float) -> bool:
    """Whether a rank of the run started at ``since`` wrote its status or an error."""
    written = [results_dir / STATUS_FILE, *(results_dir / LAUNCH_DIR).glob(f"*{ERROR_SUFFIX}")]
    return any(path.is_file() and path.stat().st_mtime >= since for path in written)


def _die_with_parent() -> None:
    """In the child before torchrun starts: on Linux, SIGTERM when the process that
    started it dies, so that a killed worker or CLI leaves no ranks training."""
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class _Watcher:
    """One look at the running group: the stop request, the grace period, the status."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        results_dir: Path,
        should_stop: Callable[[], bool] | None,
        on_status: Callable[[Status], None] | None,
        stop_grace_s: float,
    ) -> None:
        self.process = process
        self.results_dir = results_dir
        self.should_stop = should_stop
        self.on_status = on_status
        self.stop_grace_s = stop_grace_s
        self.stop_since: float | None = None
        self.killed = False
        self._last_status: Status | None = None

    def poll(self) -> None:
        if self.stop_since is None and self.should_stop is not None and self.should_stop():
            (self.results_dir / LAUNCH_DIR / CANCEL_FILE).touch()
            self.stop_since = time.monotonic()
        elif self._overdue():
            logger.warning("the ranks did not stop within %g s: killing them", self.stop_grace_s)
            self.killed = True
            stop_process_group(self.process)
        status = read_status(self.results_dir)
        if self.on_status is not None and status and status != self._last_status:
            self._last_status = status
            self.on_status(status)

    def _overdue(self) -> bool:
        if self.stop_since is None or self.killed:
            return False
        return time.monotonic() - self.stop_since > self.stop_grace_s


def stop_process_group(process: subprocess.Popen[bytes], *, grace_s: float = 30.0) -> None:
    """SIGTERM torchrun's process group (torchrun passes it to every rank), then SIGKILL."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def read_status(results_dir: Path) -> Status:
    """Rank 0's ``status.json``; empty while there is none (or it is being replaced)."""
    try:
        status: Status = json.loads((results_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return status


def rank_errors(results_dir: Path) -> list[dict[str, Any]]:
    """The errors ranks recorded in this run: the last attempt's first."""
    errors = []
    for path in (results_dir / LAUNCH_DIR).glob(f"rank-*{ERROR_SUFFIX}"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    # The rank that failed first is the cause; the others mostly lost their peers.
    return sorted(errors, key=lambda e: (-int(e.get("attempt", 0)), float(e.get("time", 0))))


def outcome(returncode: int, results_dir: Path, *, killed: bool = False) -> TrainResult:
    """Rank 0's ``TrainResult`` from the finished group, or the exception it ended with."""
    status = read_status(results_dir)
    checkpoint = Path(status["last_checkpoint"]) if status.get("last_checkpoint") else None
    step = int(status.get("step") or 0)
    if returncode == 0 and status.get("state") in ("succeeded", "stopped"):
        return TrainResult(
            step=step,
            total_steps=int(status["total_steps"]),
            checkpoint=checkpoint,
            metrics=dict(status.get("metrics") or {}),
            stop_reason=status.get("stop_reason"),
        )
    if status.get("state") == "cancelled" or killed:
        raise TrainingCancelled(step, checkpoint)
    errors = rank_errors(results_dir)
    if not errors:
        raise RankFailed(
            f"torchrun exited with status {returncode} and no rank recorded an error "
            "(a rank killed, or the hosts did not gather in time); see the log"
        )
    first = errors[0]
    message = f"rank {first['rank']}: {first['error']}"
    if first.get("input_error"):
        raise TrainingError(message)
    raise RankFailed(message)
