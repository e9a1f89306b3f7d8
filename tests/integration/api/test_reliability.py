"""Crash scenarios with real processes: a worker SIGKILLed mid-training, Redis losing its
queue, the API restarting; and cancelling a running training job."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
import redis
from fastapi.testclient import TestClient

from maskops_api.main import create_app
from maskops_api.reconciler import reconcile
from maskops_core.db.models import utcnow
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.dispatch import CeleryDispatcher
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker, wait_for
from tests.integration.api.test_workflow import create_experiment, register_demo

pytestmark = pytest.mark.integration


def _reconcile(settings: Settings, *, seconds_later: float = 0) -> object:
    engine = make_engine(settings)
    dispatcher = CeleryDispatcher(settings)
    try:
        return reconcile(
            make_session_factory(engine),
            dispatcher,
            settings,
            now=utcnow() + timedelta(seconds=seconds_later),
        )
    finally:
        dispatcher.close()
        engine.dispose()


def test_killed_worker_job_resumes_from_checkpoint_elsewhere(
    client: TestClient, clean_db: Settings, workers: Callable[[str], Worker], demo_root: str
) -> None:
    first = workers("w1")
    dataset_id = register_demo(client, demo_root, first)
    experiment_id = create_experiment(client, dataset_id, steps=6, every=2)
    job_id = client.post("/jobs", json={"action": "train", "experiment_id": experiment_id}).json()[
        "id"
    ]
    # Past step 2, so the checkpoint of step 2 exists.
    wait_for(
        client, job_id, {"running"}, worker=first, until=lambda j: (j["progress"]["step"] or 0) >= 3
    )
    first.kill()

    # The heartbeat goes stale; the reconciler (an hour "later") requeues and re-sends it.
    report = _reconcile(clean_db, seconds_later=3600)
    assert job_id in report.requeued and job_id in report.redispatched  # type: ignore[attr-defined]
    assert client.get(f"/jobs/{job_id}").json()["status"] == "queued"

    second = workers("w2")
    job = wait_for(client, job_id, {"succeeded", "failed"}, worker=second)
    logs = client.get(f"/jobs/{job_id}/logs").text
    assert job["status"] == "succeeded", logs
    assert job["attempts"] == 2 and job["progress"]["step"] == 6
    resumed = re.search(r"resuming from \S+model\.step-(\d+)\.pth at step (\d+)", logs)
    assert resumed is not None, logs
    assert int(resumed.group(2)) >= 2
    assert "attempt 2: succeeded" in logs and "attempt 1: succeeded" not in logs


def test_lost_queue_and_api_restart_lose_nothing(
    clean_db: Settings, workers: Callable[[str], Worker], demo_root: str
) -> None:
    with TestClient(base_url="http://localhost", app=create_app(clean_db)) as client:
        response = client.post(
            "/datasets",
            json={
                "name": "demo",
                "train": {
                    "image_dir": f"{demo_root}/images/train",
                    "annotation_file": f"{demo_root}/annotations/train.json",
                },
            },
            headers={"Idempotency-Key": "register-demo"},
        )
        assert response.status_code == 201
        job_id = response.json()["convert_job_id"]
    # Redis restarts empty: the job's message is gone.
    broker = redis.Redis.from_url(clean_db.broker_url)
    assert broker.llen(clean_db.cpu_queue) == 1
    broker.delete(clean_db.cpu_queue)
    report = _reconcile(clean_db)
    assert report.redispatched == [job_id]  # type: ignore[attr-defined]
    assert broker.llen(clean_db.cpu_queue) == 1
    # A second pass sees the live message and sends nothing more.
    assert _reconcile(clean_db).redispatched == []  # type: ignore[attr-defined]
    broker.close()

    worker = workers("w1")
    # A new API process: the job and the idempotency record are in the database.
    with TestClient(base_url="http://localhost", app=create_app(clean_db)) as client:
        job = wait_for(client, job_id, {"succeeded", "failed"}, worker=worker)
        assert job["status"] == "succeeded" and job["attempts"] == 1
        retry = client.post(
            "/datasets",
            json={
                "name": "demo",
                "train": {
                    "image_dir": f"{demo_root}/images/train",
                    "annotation_file": f"{demo_root}/annotations/train.json",
                },
            },
            headers={"Idempotency-Key": "register-demo"},
        )
        assert retry.json()["convert_job_id"] == job_id
        assert client.get("/jobs").json()["total"] == 1


def test_cancel_running_training_keeps_its_checkpoint(
    client: TestClient, workers: Callable[[str], Worker], demo_root: str
) -> None:
    worker = workers("w1")
    dataset_id = register_demo(client, demo_root, worker)
    experiment_id = create_experiment(client, dataset_id, steps=200, every=1000)
    job_id = client.post("/jobs", json={"action": "train", "experiment_id": experiment_id}).json()[
        "id"
    ]
    wait_for(
        client,
        job_id,
        {"running"},
        worker=worker,
        until=lambda j: (j["progress"]["step"] or 0) >= 1,
    )
    response = client.post(f"/jobs/{job_id}/cancel")
    assert response.status_code == 200 and response.json()["status"] in {"cancelling", "cancelled"}
    job = wait_for(client, job_id, {"cancelled", "failed", "succeeded"}, worker=worker, timeout=120)
    assert job["status"] == "cancelled", client.get(f"/jobs/{job_id}/logs").text
    step = job["result"]["step"]
    assert 1 <= step < 200
    assert job["result"]["checkpoint"].endswith(f"model.step-{step}.pth")
    artifacts = {a["path"] for a in client.get(f"/jobs/{job_id}/artifacts").json()}
    assert f"results/model.step-{step}.pth" in artifacts


def test_migrations_match_the_models_on_postgres(clean_db: Settings) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from maskops_core.automl import study_tables
    from maskops_core.db.models import Base

    def maskops_table(obj: object, name: str | None, type_: str, *_: object) -> bool:
        return not (type_ == "table" and name in study_tables())

    engine = make_engine(clean_db)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_object": maskops_table})
        differences = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert differences == []


def test_migration_0010_marks_trial_versions_on_postgres(postgres_url: str) -> None:
    from sqlalchemy import create_engine, text

    from tests.support.experiment_versions import check_migration_0010

    schema = f"maskops_migration_{uuid.uuid4().hex[:8]}"
    try:
        check_migration_0010(
            Settings(
                database_url=postgres_url,
                database_schema=schema,
                _env_file=None,  # type: ignore[call-arg]
            )
        )
    finally:
        engine = create_engine(postgres_url)
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()
