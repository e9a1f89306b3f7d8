"""A job that kills the pool process running it (here a SIGSEGV, as a segfault in native
code would) is sent again at once, without waiting for the heartbeat timeout, and fails the
second time saying what it was doing, while its worker goes on serving."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from maskops_core.db.models import Job
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker, wait_for
from tests.integration.api.test_workflow import create_experiment, register_demo

pytestmark = pytest.mark.integration


def _process_running(settings: Settings, job_id: int) -> int:
    """The pid of the pool process holding the job's lease (``host:pid:attempt``)."""
    engine = make_engine(settings)
    try:
        with make_session_factory(engine)() as session:
            owner = session.scalar(select(Job.lease_owner).where(Job.id == job_id))
    finally:
        engine.dispose()
    assert owner is not None
    return int(owner.split(":")[1])


def test_a_job_that_kills_its_worker_process_twice_fails_saying_what_it_was_doing(
    client: TestClient, clean_db: Settings, workers: Callable[[str], Worker], demo_root: str
) -> None:
    worker = workers("w1")
    dataset_id = register_demo(client, demo_root, worker)
    experiment_id = create_experiment(client, dataset_id, steps=5000, every=10000)
    job_id = client.post("/jobs", json={"action": "train", "experiment_id": experiment_id}).json()[
        "id"
    ]
    for attempt in (1, 2):

        def training(job: dict[str, Any], attempt: int = attempt) -> bool:
            return bool(job["attempts"] == attempt and (job["progress"]["step"] or 0) >= 1)

        # The heartbeat timeout is 60 s: a second attempt within it was not the reconciler's.
        wait_for(client, job_id, {"running"}, worker=worker, timeout=50, until=training)
        os.kill(_process_running(clean_db, job_id), signal.SIGSEGV)
    job = wait_for(client, job_id, {"failed"}, worker=worker, timeout=30)
    logs = client.get(f"/jobs/{job_id}/logs").text
    assert job["error"].startswith(
        "the worker process died 2 times running this job (signal 11 (SIGSEGV)), at '"
    ), job["error"]
    assert "progress" in job["error"] and "died (signal 11 (SIGSEGV)); the job is queued" in logs
    assert worker.process is not None and worker.process.poll() is None  # the worker lives on
