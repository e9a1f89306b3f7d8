"""The production path of worker liveness: a real ``celery worker`` on Postgres and Redis
writes its ``worker_heartbeats`` row, ``/readyz`` counts it for its queues, and a worker
stopped cleanly removes it."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from maskops_core.db.models import Job, WorkerHeartbeat
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker

pytestmark = pytest.mark.integration


def _worker_check(client: TestClient) -> str:
    return str(client.get("/readyz").json()["checks"]["worker"])


def _wait_check(client: TestClient, done: Callable[[str], bool], worker: Worker) -> str:
    deadline = time.monotonic() + 90
    while not done(check := _worker_check(client)):
        assert time.monotonic() < deadline, f"{check}\n{worker.log()[-3000:]}"
        time.sleep(0.5)
    return check


def test_readyz_counts_live_workers_on_the_queue_with_work(
    client: TestClient, clean_db: Settings, workers: Callable[[str], Worker]
) -> None:
    engine = make_engine(clean_db)
    factory = make_session_factory(engine)
    # Work on the cpu queue that no broker message carries: no worker will take it.
    with factory() as session, session.begin():
        session.add(Job(action="dataset_convert", queue=clean_db.cpu_queue))
    assert client.get("/readyz").status_code == 503
    assert _worker_check(client).startswith(f"queue {clean_db.cpu_queue} has 1 job(s) and no")

    worker = workers("w1")
    _wait_check(client, lambda check: check == "ok", worker)
    assert client.get("/readyz").status_code == 200
    with factory() as session:
        row = session.scalars(select(WorkerHeartbeat)).one()
    assert row.hostname.startswith("w1@") and row.pid == worker.process.pid  # type: ignore[union-attr]
    assert set(row.queues.split(",")) == {clean_db.gpu_queue, clean_db.cpu_queue}

    worker.stop()  # a warm shutdown removes the row: the queue is unserved at once
    _wait_check(client, lambda check: check != "ok", worker)
    with factory() as session:
        assert session.scalars(select(WorkerHeartbeat)).all() == []
    engine.dispose()
