"""The production path of worker liveness: a real ``celery worker`` on Postgres and Redis
writes its ``worker_heartbeats`` row, ``/readyz`` counts it for its queues, and a worker
stopped cleanly removes it."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from maskops.device import REQUIRE_CUDA_ENV
from maskops_core.db.models import Job, WorkerHeartbeat
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker, wait_for

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


def test_worker_that_requires_cuda_and_has_none_says_so_and_refuses_gpu_jobs(
    client: TestClient, clean_db: Settings, workers: Callable[..., Worker], demo_root: str
) -> None:
    """A GPU worker (``MASKOPS_REQUIRE_CUDA=1``, as its image sets) on a host where CUDA is
    unusable: its heartbeat and ``/readyz`` say why, and a train job fails naming the driver
    and torch's CUDA build instead of training on the CPU."""
    from tests.integration.api.test_workflow import create_experiment, register_demo

    settings = clean_db.model_copy(update={"require_cuda": True})
    worker = workers("gpu0", settings=settings)
    check = _wait_check(client, lambda check: "cannot use its GPUs" in check, worker)
    assert f"{REQUIRE_CUDA_ENV}=1" in check and "built for CUDA" in check, check
    assert client.get("/readyz").status_code == 503

    dataset_id = register_demo(client, demo_root, worker)  # cpu-queue work still runs
    experiment_id = create_experiment(client, dataset_id, steps=2, every=2)
    job_id = client.post("/jobs", json={"action": "train", "experiment_id": experiment_id}).json()
    job = wait_for(client, job_id["id"], {"succeeded", "failed"}, worker=worker)
    assert job["status"] == "failed", job
    assert "a GPU is required" in job["error"] and "built for CUDA" in job["error"], job
    assert "driver" in job["error"], job
