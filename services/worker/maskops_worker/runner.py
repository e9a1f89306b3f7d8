"""``run_job``: claim a job, run its action with heartbeats, record the outcome.

Celery tasks are one-line wrappers over :func:`run_job`; tests call it directly. No
database transaction is held while the action runs: the claim, every heartbeat, progress
report and the final status are separate short transactions.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import traceback
import uuid

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from maskops_core import job_state
from maskops_core.db.models import JobStatus
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.paths import relative_to_root
from maskops_core.settings import Settings, get_settings
from maskops_worker import forks, streak
from maskops_worker.contract import (
    Action,
    JobCancelled,
    JobContext,
    JobInputError,
    JobRequeued,
)

log = logging.getLogger(__name__)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _HeartbeatThread(threading.Thread):
    def __init__(self, ctx: JobContext, interval_s: float) -> None:
        super().__init__(name=f"heartbeat-{ctx.job.id}", daemon=True)
        self.ctx = ctx
        self.interval_s = interval_s
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            try:
                beat = job_state.heartbeat(self.ctx.factory, self.ctx.job.id, owner=self.ctx.owner)
            except SQLAlchemyError as exc:
                log.warning("job %s: heartbeat failed: %s", self.ctx.job.id, exc)
                continue
            if beat.lease_lost:
                self.ctx.lease_lost.set()
                self.ctx.stop_event.set()
                return
            if beat.cancel_requested:
                self.ctx.stop_event.set()


_factories: dict[str, sessionmaker[Session]] = {}


def session_factory(settings: Settings) -> sessionmaker[Session]:
    """One engine per database per process (a worker runs many jobs)."""
    key = f"{settings.database_url}|{settings.database_schema}"
    if key not in _factories:
        _factories[key] = make_session_factory(forks.tracked(make_engine(settings)))
    return _factories[key]


def run_job(
    job_id: int,
    *,
    settings: Settings | None = None,
    actions: dict[str, Action] | None = None,
) -> str:
    """Run job ``job_id`` if it is queued; returns its final status, or ``"skipped"`` when
    another worker holds it or it is no longer queued, or ``"lease_lost"``."""
    settings = settings or get_settings()
    if actions is None:
        # Imported here so that importing the runner (tests, the tasks module) stays light.
        from maskops_worker.actions import ACTIONS

        actions = ACTIONS
    factory = session_factory(settings)
    owner = _owner()
    job = job_state.claim(factory, job_id, owner=owner, worker_id=socket.gethostname())
    if job is None:
        log.info("job %s is not queued; skipping this delivery", job_id)
        return "skipped"
    work_dir = job_state.job_dir(settings.data_root, job_id)
    work_dir.mkdir(parents=True, exist_ok=True)
    ctx = JobContext(
        job=job,
        settings=settings,
        work_dir=work_dir,
        log_file=work_dir / "job.log",
        factory=factory,
        owner=owner,
    )
    ctx.job_log.write(f"attempt {job.attempts}: {job.action} started by {owner}")
    beat = _HeartbeatThread(ctx, settings.heartbeat_interval_s)
    beat.start()
    status, error, result = JobStatus.failed, None, None
    try:
        action = actions.get(job.action)
        if action is None:
            raise JobInputError(f"unknown action {job.action!r}")
        result = action(ctx)
        status = JobStatus.cancelled if ctx.cancel_requested else JobStatus.succeeded
        streak.task_ended(None)
    except JobCancelled as cancelled:
        status, result = JobStatus.cancelled, cancelled.result
    except JobRequeued as requeued:
        status, error = JobStatus.queued, relative_to_root(str(requeued), settings.data_root)
    except Exception as exc:
        streak.task_ended(exc)
        error = relative_to_root(_one_line(exc), settings.data_root)
        ctx.job_log.write(traceback.format_exc())
    finally:
        beat.done.set()
        beat.join()
    if ctx.lease_lost.is_set():
        ctx.job_log.write(f"attempt {job.attempts}: lease lost; another worker owns it")
        return "lease_lost"
    ctx.job_log.write(f"attempt {job.attempts}: {status}" + (f": {error}" if error else ""))
    if status == JobStatus.queued:
        kept = job_state.requeue(factory, job_id, owner=owner, reason=str(error))
    else:
        kept = job_state.finish(
            factory, job_id, owner=owner, status=status, error=error, result=result
        )
    return str(status) if kept else "lease_lost"


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, JobInputError):
        return message
    return f"{type(exc).__name__}: {message}"


def run_node(job_id: int, attempt: int, endpoint: str, *, settings: Settings | None = None) -> str:
    """Run one more node of multi-node job ``job_id``'s attempt ``attempt``, joining the
    rendezvous at ``endpoint`` that the worker leading it hosts. The leader owns the job's
    state; this node only appends to its log. Returns ``"skipped"`` when that attempt is
    over, else how the node ended."""
    from maskops_worker.actions import train_node

    settings = settings or get_settings()
    factory = session_factory(settings)
    job = job_state.running_snapshot(factory, job_id)
    if job is None or job.attempts != attempt:
        log.info("job %s attempt %s is not running; skipping this node", job_id, attempt)
        return "skipped"
    work_dir = job_state.job_dir(settings.data_root, job_id)
    ctx = JobContext(job, settings, work_dir, work_dir / "job.log", factory, owner=_owner())
    ctx.job_log.write(f"attempt {attempt}: a node joins on {socket.gethostname()}")
    try:
        train_node(ctx, endpoint)
    except Exception as exc:
        ctx.job_log.write(f"attempt {attempt}: the node on {ctx.owner} ended: {exc}")
        return "failed"
    return "succeeded"
