"""The reconciler: makes the broker agree with the database, which is the source of truth.

- A running (or cancelling) job whose heartbeat is older than ``heartbeat_timeout_s`` lost
  its worker: a running one goes back to queued and is re-dispatched (training resumes from
  its last checkpoint) unless it already had ``max_attempts`` attempts (then it fails), a
  cancelling one becomes cancelled. The takeover clears the lease, so
  a worker that was merely slow can no longer write to the job.
- A published model Triton does not serve (it restarted: it loads nothing by itself) is
  loaded again (:mod:`maskops_api.serving.published`).
- A queued job whose message is in no broker queue (Redis lost it, or the broker was down
  when the job was created) is re-sent once it is older than ``redispatch_after_s``.

Duplicate messages are harmless: only a queued job can be claimed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.serving.published import serve_published_on_replicas
from maskops_core.db.models import Job, JobStatus, utcnow
from maskops_core.db.session import rowcount, transaction
from maskops_core.dispatch import Dispatcher, dispatch_job
from maskops_core.job_state import what_it_was_doing
from maskops_core.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    requeued: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    redispatched: list[int] = field(default_factory=list)


def live_task_ids(settings: Settings, *, now: float | None = None) -> set[str] | None:
    """Task ids of messages waiting in the job queues or being worked on, from Redis.

    ``None`` when the broker is not Redis or cannot be read (callers fall back to age).
    An unacknowledged message older than the heartbeat timeout belongs to a dead worker
    (a live one claims its job at once) and does not count.
    """
    if not settings.broker_url.startswith(("redis://", "rediss://")):
        return None
    import redis

    now = time.time() if now is None else now
    try:
        client = redis.Redis.from_url(settings.broker_url, socket_timeout=3)
        ids: set[str] = set()
        prefix = settings.broker_key_prefix
        for queue in (settings.gpu_queue, settings.cpu_queue):
            for raw in client.lrange(prefix + queue, 0, -1):
                ids.add(json.loads(raw)["headers"]["id"])
        fresh_after = now - settings.heartbeat_timeout_s
        for tag, raw in client.hgetall(prefix + "unacked").items():
            score = client.zscore(prefix + "unacked_index", tag)
            if score is not None and score >= fresh_after:
                ids.add(json.loads(raw)[0]["headers"]["id"])
        client.close()
        return ids
    except Exception as exc:
        log.warning("reconciler: cannot read the broker (%s)", exc)
        return None


def reconcile(
    factory: sessionmaker[Session],
    dispatcher: Dispatcher,
    settings: Settings,
    *,
    now: datetime | None = None,
) -> ReconcileReport:
    """One pass; safe to run concurrently with workers, the API and other reconcilers."""
    now = now or utcnow()
    report = ReconcileReport()
    stale = now - timedelta(seconds=settings.heartbeat_timeout_s)
    with transaction(factory) as session:
        orphans = session.execute(
            select(
                Job.id,
                Job.status,
                Job.lease_owner,
                Job.attempts,
                Job.progress_step,
                Job.progress_total,
            ).where(
                Job.status.in_([JobStatus.running, JobStatus.cancelling]),
                or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < stale),
            )
        ).all()
    for job_id, status, owner, attempts, step, total in orphans:
        target = JobStatus.queued if status == JobStatus.running else JobStatus.cancelled
        values: dict[str, object] = {"status": target, "lease_owner": None, "updated_at": now}
        if target == JobStatus.queued and attempts >= settings.max_attempts:
            target = JobStatus.failed
            doing = what_it_was_doing(settings.data_root, job_id, step, total)
            values.update(
                status=target,
                error=f"the worker was lost {attempts} times (heartbeat timeout), {doing}; "
                "giving up",
            )
        if target != JobStatus.queued:
            values["finished_at"] = now
        with transaction(factory) as session:
            taken = rowcount(
                session.execute(
                    update(Job)
                    .where(Job.id == job_id, Job.status == status, Job.lease_owner == owner)
                    .where(or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < stale))
                    .values(**values)
                )
            )
        if taken:
            {
                JobStatus.queued: report.requeued,
                JobStatus.cancelled: report.cancelled,
                JobStatus.failed: report.failed,
            }[target].append(job_id)
            log.warning("reconciler: job %s had a stale heartbeat; now %s", job_id, target)

    live = live_task_ids(settings)
    due = now - timedelta(seconds=settings.redispatch_after_s)
    with transaction(factory) as session:
        queued = session.scalars(
            select(Job)
            .where(Job.status == JobStatus.queued)
            .where(
                or_(
                    Job.dispatched_at.is_(None),
                    Job.dispatched_at < due,
                    Job.id.in_(report.requeued),
                )
            )
            .order_by(Job.id)
        ).all()
    for job in queued:
        requeued = job.id in report.requeued
        if not requeued and live is not None and job.task_id in live:
            continue
        if dispatch_job(factory, dispatcher, job):
            report.redispatched.append(job.id)
    return report


class ReconcilerThread(threading.Thread):
    """Runs :func:`reconcile` every ``reconcile_interval_s`` until stopped."""

    def __init__(
        self, factory: sessionmaker[Session], dispatcher: Dispatcher, settings: Settings
    ) -> None:
        super().__init__(name="maskops-reconciler", daemon=True)
        self.factory, self.dispatcher, self.settings = factory, dispatcher, settings
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.settings.reconcile_interval_s):
            try:
                reconcile(self.factory, self.dispatcher, self.settings)
                if self.settings.has_triton:
                    # A restarted Triton serves nothing until the published models load.
                    passes = serve_published_on_replicas(self.factory, self.settings)
                    for url, served in passes.items():
                        if served.loaded or served.failed:
                            log.info(
                                "Triton %s loaded %s; failed %s", url, served.loaded, served.failed
                            )
            except Exception:
                log.exception("reconciler pass failed")

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)
