"""Worker liveness from the ``worker_heartbeats`` table: which queues have work and no live
worker, what a worker's GPUs offer a train job, and rows of workers gone for good."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from maskops_core.db.models import JobStatus, WorkerHeartbeat, utcnow
from maskops_core.settings import Settings
from maskops_core.workers import beat, check_workers, forget, rank_offers
from tests.support.control_plane import insert_job

STARTED = utcnow()


def _beat(factory: sessionmaker[Session], host: str, queues: list[str], **kw: object) -> None:
    beat(factory, host, queues=queues, pid=100, started_at=STARTED, retention_s=3600, **kw)  # type: ignore[arg-type]


def test_a_queue_with_work_and_no_live_worker_is_named(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    with factory() as session:
        assert check_workers(session, settings) == "ok"  # no work, no worker: nothing missing
    insert_job(factory)  # queued on t_gpu
    insert_job(factory, status=JobStatus.succeeded)  # done: needs no worker
    with factory() as session:
        problem = check_workers(session, settings)
    assert problem.startswith("queue t_gpu has 1 job(s) and no worker heartbeat")
    _beat(factory, "gpu-host", ["t_gpu"])
    with factory() as session:
        assert check_workers(session, settings) == "ok"


def test_a_stale_heartbeat_is_no_live_worker(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    insert_job(factory)
    _beat(factory, "gpu-host", ["t_gpu"])
    later = utcnow() + timedelta(seconds=settings.heartbeat_timeout_s + 1)
    with factory() as session:
        assert "no worker heartbeat" in check_workers(session, settings, now=later)


def test_a_supervised_worker_counts_only_once_it_has_beaten(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    _beat(factory, "old", ["t_gpu"])  # pid 100
    with factory() as session:
        assert "pid 200" in check_workers(session, settings, expected_pid=200)
        assert check_workers(session, settings, expected_pid=100) == "ok"


def test_a_worker_that_cannot_use_its_gpus_is_reported(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    _beat(factory, "gpu-host", ["t_gpu"], gpus=2, cuda="unusable: driver 535 < 580")
    with factory() as session:
        assert "worker gpu-host cannot use its GPUs" in check_workers(session, settings)


def test_rank_offers_one_per_gpu_or_the_cpu_ranks(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    _beat(factory, "two-gpus", ["t_gpu"], gpus=2)
    _beat(factory, "cpu-only", ["t_gpu", "t_cpu"])
    _beat(factory, "other-queue", ["t_cpu"], gpus=8)
    with factory() as session:
        assert rank_offers(session, settings, "t_gpu") == [2, settings.cpu_ranks]


def test_rows_of_workers_gone_for_good_are_deleted(factory: sessionmaker[Session]) -> None:
    _beat(factory, "stopped", ["t_gpu"])
    _beat(factory, "killed", ["t_gpu"])
    with factory() as session, session.begin():
        session.get_one(WorkerHeartbeat, "killed").last_seen = utcnow() - timedelta(hours=2)
    forget(factory, "stopped")
    _beat(factory, "alive", ["t_gpu"])  # each beat prunes rows older than the retention
    with factory() as session:
        assert [r.hostname for r in session.query(WorkerHeartbeat)] == ["alive"]
