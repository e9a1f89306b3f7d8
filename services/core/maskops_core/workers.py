"""Worker liveness: each worker refreshes a ``worker_heartbeats`` row; the API's ``/readyz``
names every queue that has work but no worker whose heartbeat is fresh.

The same table serves the compose stack and ``maskops serve`` (whose SQLite broker carries
no Celery remote control, so ``inspect ping`` is not an option there).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from maskops_core.db.models import Job, JobStatus, WorkerHeartbeat, utcnow
from maskops_core.db.session import transaction
from maskops_core.settings import Settings

CUDA_UNUSABLE = ("unusable:", "failed:")
"""Prefixes of a heartbeat's ``cuda`` check that make ``/readyz`` report the worker."""
WAITING_STATUSES = (JobStatus.queued, JobStatus.running, JobStatus.cancelling)
"""Jobs that need a worker on their queue."""


def beat(
    factory: sessionmaker[Session],
    hostname: str,
    *,
    queues: Sequence[str],
    pid: int,
    started_at: datetime,
    retention_s: float,
    gpus: int = 0,
    cuda: str = "",
    failing: str = "",
) -> None:
    """Create or refresh this worker's row, and delete the rows of workers that have not
    beaten for ``retention_s`` (killed without a clean stop: nothing else removes them)."""
    with transaction(factory) as session:
        expired = utcnow() - timedelta(seconds=retention_s)
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.last_seen < expired))
        row = session.get(WorkerHeartbeat, hostname)
        if row is None:
            row = WorkerHeartbeat(hostname=hostname)
            session.add(row)
        row.queues = ",".join(queues)
        row.pid = pid
        row.gpus = gpus
        row.cuda = cuda
        row.failing = failing
        row.started_at = started_at
        row.last_seen = utcnow()


def worker_ranks(gpus: int, settings: Settings) -> int:
    """The ranks a worker can give one train job: one per GPU, or ``cpu_ranks`` gloo
    processes on a worker without a GPU."""
    return gpus or settings.cpu_ranks


def rank_offers(
    session: Session, settings: Settings, queue: str, *, now: datetime | None = None
) -> list[int]:
    """The ranks (:func:`worker_ranks`) each live worker of ``queue`` offers, most first."""
    fresh_after = (now or utcnow()) - timedelta(seconds=settings.heartbeat_timeout_s)
    rows = session.scalars(select(WorkerHeartbeat).where(WorkerHeartbeat.last_seen >= fresh_after))
    offers = [worker_ranks(r.gpus, settings) for r in rows if queue in r.queues.split(",")]
    return sorted(offers, reverse=True)


def forget(factory: sessionmaker[Session], hostname: str) -> None:
    """A worker that stops cleanly removes its row (it is not missing, it is gone)."""
    with transaction(factory) as session:
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.hostname == hostname))


def check_workers(
    session: Session,
    settings: Settings,
    *,
    expected_pid: int | None = None,
    now: datetime | None = None,
) -> str:
    """``"ok"``, or which queue has work and no live worker.

    ``expected_pid``: the worker process a supervisor (``maskops serve``) started; until it
    has beaten, an older worker's fresh row does not count.
    """
    now = now or utcnow()
    fresh_after = now - timedelta(seconds=settings.heartbeat_timeout_s)
    rows = session.scalars(select(WorkerHeartbeat).where(WorkerHeartbeat.last_seen >= fresh_after))
    live = [r for r in rows if expected_pid is None or r.pid == expected_pid]
    if expected_pid is not None and not live:
        return f"worker (pid {expected_pid}) is starting: no heartbeat from it yet"
    served = {queue for row in live for queue in row.queues.split(",")}
    query = (
        select(Job.queue, func.count())
        .where(Job.status.in_([str(s) for s in WAITING_STATUSES]))
        .group_by(Job.queue)
    )
    waiting: dict[str, int] = dict(session.execute(query).all())
    missing = [
        f"queue {queue} has {count} job(s) and no worker heartbeat in the last"
        f" {settings.heartbeat_timeout_s:.0f} s"
        for queue, count in sorted(waiting.items())
        if queue not in served
    ]
    broken = [
        f"worker {row.hostname} cannot use its GPUs and refuses GPU jobs: {row.cuda}"
        for row in live
        if row.cuda.startswith(CUDA_UNUSABLE)
    ]
    broken += [f"worker {row.hostname}: {row.failing}" for row in live if row.failing]
    stalled = stalled_queues(session, settings, now=now)
    return "; ".join(missing + broken + stalled) or "ok"


def stalled_queues(session: Session, settings: Settings, *, now: datetime) -> list[str]:
    """Queues whose oldest sent job has waited ``queue_stall_after_s`` while no job runs
    anywhere but search controllers: every slot is taken by controllers waiting on the
    very jobs queued behind them, or no worker takes the messages. (Workers busy with
    other jobs are not stalled, however long the queue waits.)"""
    running = Job.status.in_([JobStatus.running, JobStatus.cancelling])
    if session.scalar(select(Job.id).where(running, Job.action != "automl").limit(1)):
        return []
    due = now - timedelta(seconds=settings.queue_stall_after_s)
    query = (
        select(Job.queue, Job.id, Job.updated_at)
        .where(Job.status == JobStatus.queued, Job.dispatched_at.is_not(None))
        .where(Job.updated_at < due)
        .order_by(Job.updated_at)
    )
    oldest: dict[str, tuple[int, datetime]] = {}
    for queue, job_id, since in session.execute(query):
        oldest.setdefault(queue, (job_id, since))
    return [
        f"queue {queue} is stalled: job {job_id} has waited {(now - since).total_seconds():.0f}"
        " s while no job runs but search controllers"
        for queue, (job_id, since) in sorted(oldest.items())
    ]
