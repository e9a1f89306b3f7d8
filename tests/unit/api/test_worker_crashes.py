"""A job whose worker process dies under it (a segfault, the OOM killer) is sent again once
and fails the second time, saying what it was doing; so does one that keeps losing its
whole worker (the reconciler)."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from maskops_api.reconciler import reconcile
from maskops_core.db.models import Job, utcnow
from maskops_core.job_state import MAX_WORKER_CRASHES, job_dir, worker_crashed
from maskops_core.settings import Settings
from tests.support.control_plane import get_job, insert_job
from tests.unit.api.conftest import RecordingDispatcher

OWNER = f"{socket.gethostname()}:4242:0a1b2c3d"
LINE = "converting train: coco annotations demo/annotations/train.json, images demo/images"


def _running(factory: sessionmaker[Session], settings: Settings, **values: Any) -> int:
    job_id = insert_job(factory, status="running", lease_owner=OWNER, attempts=1, **values)
    folder = job_dir(settings.data_root, job_id)
    folder.mkdir(parents=True)
    (folder / "job.log").write_text(f"attempt 1: dataset_convert started by {OWNER}\n{LINE}\n\n")
    return job_id


def test_a_job_that_kills_its_worker_process_twice_fails_saying_what_it_was_doing(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    job_id = _running(factory, settings, progress_step=17, progress_total=40)
    assert MAX_WORKER_CRASHES == 2

    def crashed(why: str, pid: int = 4242) -> str | None:
        prefix = f"{socket.gethostname()}:{pid}:"
        return worker_crashed(
            factory, job_id, owner_prefix=prefix, why=why, data_root=settings.data_root
        )

    assert crashed("signal 11 (SIGSEGV)") == "queued"
    job = get_job(factory, job_id)
    assert job.lease_owner is None and job.worker_crashes == 1
    assert job.error == f"the worker process died (signal 11 (SIGSEGV)), at {LINE!r}, " + (
        "progress 17/40; sent again"
    )
    with factory() as s, s.begin():
        s.get_one(Job, job_id).status = "running"
        s.get_one(Job, job_id).lease_owner = OWNER
    # Another process of this host (pid 42) never held the job: nothing to record.
    assert crashed("signal 9 (SIGKILL)", pid=42) is None
    assert crashed("signal 9 (SIGKILL)") == "failed"
    job = get_job(factory, job_id)
    assert job.status == "failed" and job.finished_at is not None
    assert job.error == (
        f"the worker process died 2 times running this job (signal 9 (SIGKILL)), at {LINE!r}, "
        "progress 17/40"
    )


def test_a_job_that_keeps_losing_its_worker_fails_saying_what_it_was_doing(
    settings: Settings, factory: sessionmaker[Session], dispatcher: RecordingDispatcher
) -> None:
    job_id = _running(factory, settings, heartbeat_at=utcnow() - timedelta(hours=1))
    with factory() as s, s.begin():
        s.get_one(Job, job_id).attempts = settings.max_attempts
    assert reconcile(factory, dispatcher, settings).failed == [job_id]
    assert get_job(factory, job_id).error == (
        f"the worker was lost 5 times (heartbeat timeout), at {LINE!r}, no progress reported; "
        "giving up"
    )
