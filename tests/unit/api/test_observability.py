"""Health, readiness, Prometheus metrics and log following."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select, update

from maskops_api.main import create_app
from maskops_core.db.models import Job, WorkerHeartbeat, utcnow
from maskops_core.settings import Settings
from maskops_core.workers import beat
from tests.unit.api.conftest import DATASET_BODY, RecordingDispatcher


def test_healthz_and_readyz(client: TestClient, settings: Settings) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "checks": {}}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "worker": "ok", "broker": "ok"}


def test_readyz_names_a_queue_with_work_and_no_live_worker(
    client: TestClient, settings: Settings, factory
) -> None:
    client.post("/datasets", json=DATASET_BODY)  # a dataset_convert job on the cpu queue
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["worker"] == (
        "queue t_cpu has 1 job(s) and no worker heartbeat in the last 30 s"
    )
    # A worker on the other queue does not help; one on this queue does, while it beats.
    beat(factory, "gpu@host", queues=["t_gpu"], pid=1, started_at=utcnow(), retention_s=3600)
    assert client.get("/readyz").status_code == 503
    beat(
        factory, "cpu@host", queues=["t_gpu", "t_cpu"], pid=2, started_at=utcnow(), retention_s=3600
    )
    assert client.get("/readyz").json()["checks"]["worker"] == "ok"
    stale = utcnow() - timedelta(seconds=31)
    with factory() as s, s.begin():
        s.execute(update(WorkerHeartbeat).values(last_seen=stale))
    assert client.get("/readyz").status_code == 503


def test_a_beat_deletes_rows_older_than_the_retention(factory) -> None:
    for name in ("killed@host", "stale@host", "live@host"):
        beat(factory, name, queues=["t_cpu"], pid=1, started_at=utcnow(), retention_s=3600)
    ages = {"killed@host": 3601, "stale@host": 3599}
    with factory() as s, s.begin():
        for name, age in ages.items():
            s.execute(
                update(WorkerHeartbeat)
                .where(WorkerHeartbeat.hostname == name)
                .values(last_seen=utcnow() - timedelta(seconds=age))
            )
    beat(factory, "live@host", queues=["t_cpu"], pid=1, started_at=utcnow(), retention_s=3600)
    with factory() as s:
        left = set(s.scalars(select(WorkerHeartbeat.hostname)))
    assert left == {"stale@host", "live@host"}


def test_readyz_reports_what_is_down(settings: Settings) -> None:
    broken = settings.model_copy(
        update={"broker_url": "redis://127.0.0.1:1/0", "triton_url": "127.0.0.1:1"}
    )
    with TestClient(
        base_url="http://localhost", app=create_app(broken, dispatcher=RecordingDispatcher())
    ) as client:
        ready = client.get("/readyz")
    assert ready.status_code == 503
    checks = ready.json()["checks"]
    assert checks["database"] == "ok"
    assert checks["broker"].startswith("unreachable") and checks["triton"].startswith("unreachable")


def test_prometheus_metrics(client: TestClient) -> None:
    client.post("/datasets", json=DATASET_BODY)
    client.get("/jobs/1")
    text = client.get("/metrics").text
    assert 'maskops_jobs{action="dataset_convert",status="queued"} 1.0' in text
    assert (
        'maskops_http_request_seconds_count{method="GET",route="/jobs/{job_id}",status="200"} 1.0'
        in text
    )


def test_log_follow_streams_until_the_job_ends(
    client: TestClient, settings: Settings, factory
) -> None:
    job_id = client.post("/datasets", json=DATASET_BODY).json()["convert_job_id"]
    log = settings.jobs_dir / str(job_id) / "job.log"
    log.parent.mkdir(parents=True)
    log.write_text("line 1\n")
    with factory() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(status="running"))

    def finish() -> None:
        time.sleep(1.0)
        with log.open("a") as f:
            f.write("line 2\n")
        with factory() as s, s.begin():
            s.execute(update(Job).where(Job.id == job_id).values(status="succeeded"))

    threading.Thread(target=finish).start()
    start = time.monotonic()
    streamed = client.get(f"/jobs/{job_id}/logs", params={"follow": "true"})
    assert streamed.text == "line 1\nline 2\n"
    assert time.monotonic() - start >= 0.9
    assert client.get(f"/jobs/{job_id}/logs", params={"offset": 7}).text == "line 2\n"
