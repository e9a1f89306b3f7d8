"""The reconciler on a real (SQLite) database: it re-dispatches queued jobs, requeues
jobs whose worker stopped beating (that worker loses its lease), finishes stale cancels,
and fails a job that keeps losing its worker."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from maskops_api.reconciler import reconcile
from maskops_core.db.models import JobStatus, utcnow
from maskops_core.settings import Settings
from maskops_worker.contract import JobContext
from maskops_worker.runner import run_job
from tests.support.control_plane import get_job as _get
from tests.support.control_plane import insert_job as _job
from tests.unit.api.conftest import RecordingDispatcher


def test_stale_job_is_requeued_and_the_old_worker_loses_its_lease(
    settings: Settings, factory, dispatcher: RecordingDispatcher
) -> None:
    job_id = _job(factory)
    started = threading.Event()
    outcome: list[str] = []

    def slow(ctx: JobContext) -> dict[str, Any]:
        started.set()
        while not ctx.stop_event.is_set():
            time.sleep(0.01)
        return {}

    def work() -> None:
        outcome.append(run_job(job_id, settings=settings, actions={"train": slow}))

    worker = threading.Thread(target=work)
    worker.start()
    assert started.wait(10)
    # Pretend the worker stopped beating long ago (a frozen or killed process).
    future = utcnow() + timedelta(seconds=settings.heartbeat_timeout_s + 5)
    report = reconcile(factory, dispatcher, settings, now=future)
    assert report.requeued == [job_id] and job_id in report.redispatched
    worker.join(20)
    assert outcome == ["lease_lost"]
    job = _get(factory, job_id)
    assert job.status == "queued" and job.lease_owner is None
    # The re-dispatched delivery runs it again: attempt 2.
    assert (
        run_job(job_id, settings=settings, actions={"train": lambda c: {"ok": True}}) == "succeeded"
    )
    assert _get(factory, job_id).attempts == 2


def test_reconciler_redispatches_queued_jobs_and_finishes_stale_cancels(
    settings: Settings, factory, dispatcher: RecordingDispatcher
) -> None:
    never_sent = _job(factory)
    stale_cancel = _job(
        factory, status="cancelling", lease_owner="gone", heartbeat_at=utcnow() - timedelta(hours=1)
    )
    fresh = _job(factory, status="running", lease_owner="alive", heartbeat_at=utcnow())
    report = reconcile(factory, dispatcher, settings)
    assert report.redispatched == [never_sent]
    assert report.cancelled == [stale_cancel]
    assert dispatcher.sent == [("train", never_sent, "t_gpu", f"maskops-job-{never_sent}-1")]
    assert _get(factory, stale_cancel).status == JobStatus.cancelled
    assert _get(factory, fresh).status == JobStatus.running


def test_a_job_that_keeps_losing_its_worker_fails(
    settings: Settings, factory, dispatcher: RecordingDispatcher
) -> None:
    stale = utcnow() - timedelta(hours=1)
    job_id = _job(
        factory,
        status="running",
        lease_owner="gone",
        heartbeat_at=stale,
        attempts=settings.max_attempts,
    )
    report = reconcile(factory, dispatcher, settings)
    assert report.failed == [job_id] and report.requeued == [] and dispatcher.sent == []
    job = _get(factory, job_id)
    assert job.status == "failed" and "lost 5 times" in (job.error or "")
