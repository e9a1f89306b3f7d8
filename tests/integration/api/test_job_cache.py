"""The in-memory job cache behind ``GET /jobs/{id}``, against real Postgres notifications.

Rows are changed the way a worker changes them: from another connection, straight in the
database. A poll must never show a state older than the last committed one for longer
than the notification takes to arrive.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text

from maskops_api.cache.job_cache import ETA_MAX_AGE, JobCache
from maskops_api.deps import get_job_cache
from maskops_api.main import create_app
from maskops_core.db.models import Job, JobStatus
from maskops_core.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def api(clean_db: Settings) -> Iterator[tuple[TestClient, JobCache]]:
    with TestClient(base_url="http://localhost", app=create_app(clean_db)) as client:
        cache: JobCache = client.app.state.job_cache  # type: ignore[attr-defined]
        assert cache.wait_live(10), "the notification listener did not connect"
        yield client, cache


@pytest.fixture
def worker_db(clean_db: Settings) -> Iterator[Engine]:
    """A connection of the worker's kind: another process's view of the same schema."""
    engine = create_engine(
        clean_db.database_url,
        connect_args={"options": f"-csearch_path={clean_db.database_schema}"},
    )
    yield engine
    engine.dispose()


def add_job(client: TestClient, status: JobStatus = JobStatus.queued) -> int:
    with client.app.state.session_factory() as session:  # type: ignore[attr-defined]
        job = Job(action="train", queue="gpu", status=status, options={})
        session.add(job)
        session.commit()
        return job.id


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def test_polls_are_served_from_memory_and_follow_worker_writes(
    api: tuple[TestClient, JobCache], worker_db: Engine
) -> None:
    client, cache = api
    job_id = add_job(client)
    assert client.get(f"/jobs/{job_id}").json()["status"] == "queued"
    misses = cache.misses
    for _ in range(20):
        assert client.get(f"/jobs/{job_id}").json()["status"] == "queued"
    assert cache.misses == misses, "repeated polls of an unchanged job went to the database"
    hits = cache.hits

    for step in (10, 20, 30):
        with worker_db.begin() as conn:
            conn.execute(
                text("UPDATE jobs SET status = 'running', progress_step = :s, "
                     "progress_total = 100 WHERE id = :i"),
                {"s": step, "i": job_id},
            )  # fmt: skip

        def shows(step: int = step) -> bool:
            return bool(client.get(f"/jobs/{job_id}").json()["progress"]["step"] == step)

        assert eventually(shows), f"the poll never showed step {step}"
    assert client.get(f"/jobs/{job_id}").json()["status"] == "running"
    # The changed row is read again by the listener, so the followed job stays in memory.
    assert cache.hits > hits


class RouteEntered(Exception):
    pass


async def _enter_route() -> JobCache:
    raise RouteEntered


def test_cached_polls_are_answered_before_the_app_as_the_route_answers(
    api: tuple[TestClient, JobCache], worker_db: Engine
) -> None:
    client, cache = api
    job_id, other = add_job(client), add_job(client)
    with worker_db.begin() as conn:  # a running job with progress: its ETA is computed
        conn.execute(
            text("UPDATE jobs SET status = 'running', progress_step = 5, progress_total = 50, "
                 "progress_started_step = 0, progress_started_at = now() - interval '10 s' "
                 "WHERE id = :i"),
            {"i": job_id},
        )  # fmt: skip
    assert eventually(lambda: client.get(f"/jobs/{job_id}").json()["status"] == "running")
    from_route = client.get(f"/jobs/{job_id}")
    assert cache.body(job_id) is not None
    client.app.dependency_overrides[get_job_cache] = _enter_route  # type: ignore[attr-defined]
    try:
        with pytest.raises(RouteEntered):  # the override is in force for the route
            client.get(f"/jobs/{other}")
        hits = cache.hits
        shortcut = client.get(f"/jobs/{job_id}")
        assert cache.hits == hits + 1
    finally:
        client.app.dependency_overrides.clear()  # type: ignore[attr-defined]
    assert shortcut.status_code == 200
    assert shortcut.headers["content-type"] == from_route.headers["content-type"]
    assert int(shortcut.headers["content-length"]) == len(shortcut.content)
    fresh, cached = shortcut.json(), from_route.json()
    # The ETA is computed per answer (from the time since the last progress report); the
    # rest is the route's answer.
    fresh_eta = fresh["progress"].pop("eta_seconds")
    assert fresh_eta >= cached["progress"].pop("eta_seconds") > 0
    assert fresh == cached
    # No progress since: the estimate grows with the time waited, answer after answer.
    time.sleep(ETA_MAX_AGE)
    later = client.get(f"/jobs/{job_id}").json()["progress"]["eta_seconds"]
    assert later > fresh_eta
    assert client.get("/jobs/0").status_code == 422  # invalid ids are the route's to judge
    metrics = client.get("/metrics").text
    assert 'route="/jobs/{job_id}",status="200"' in metrics


def test_with_auth_required_cached_polls_still_need_a_token(clean_db: Settings) -> None:
    settings = clean_db.model_copy(update={"auth": "required"})
    with TestClient(base_url="http://localhost", app=create_app(settings)) as client:
        cache: JobCache = client.app.state.job_cache  # type: ignore[attr-defined]
        assert cache.wait_live(10)
        job_id = add_job(client)
        cache.load(job_id)
        assert cache.body(job_id) is not None
        response = client.get(f"/jobs/{job_id}")
        assert response.status_code == 401, response.text


def test_own_writes_are_visible_at_once(api: tuple[TestClient, JobCache]) -> None:
    client, _ = api
    job_id = add_job(client)
    client.get(f"/jobs/{job_id}")
    assert client.post(f"/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    assert client.get(f"/jobs/{job_id}").json()["status"] == "cancelled"


def test_truncate_and_delete_drop_cached_rows(
    api: tuple[TestClient, JobCache], worker_db: Engine
) -> None:
    client, _ = api
    first, second = add_job(client), add_job(client)
    assert client.get(f"/jobs/{first}").status_code == 200
    assert client.get(f"/jobs/{second}").status_code == 200
    with worker_db.begin() as conn:
        conn.execute(text("DELETE FROM jobs WHERE id = :i"), {"i": first})
    assert eventually(lambda: client.get(f"/jobs/{first}").status_code == 404)
    with worker_db.begin() as conn:
        conn.execute(text("TRUNCATE jobs CASCADE"))
    assert eventually(lambda: client.get(f"/jobs/{second}").status_code == 404)


def test_lost_listener_turns_the_cache_off_until_it_is_back(
    api: tuple[TestClient, JobCache], worker_db: Engine
) -> None:
    client, cache = api
    job_id = add_job(client)
    client.get(f"/jobs/{job_id}")
    with worker_db.begin() as conn:
        killed = conn.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE query = 'LISTEN maskops_job_changed' AND pid <> pg_backend_pid()")
        ).all()  # fmt: skip
    assert killed, "no listener connection found"
    assert eventually(lambda: not cache.live), "the cache kept serving without its listener"
    # Notifications sent now reach nobody: polls must read the database meanwhile.
    with worker_db.begin() as conn:
        conn.execute(text("UPDATE jobs SET status = 'running' WHERE id = :i"), {"i": job_id})
    if not cache.live:
        assert client.get(f"/jobs/{job_id}").json()["status"] == "running"
    assert eventually(lambda: cache.live, timeout=15), "the listener did not reconnect"
    assert client.get(f"/jobs/{job_id}").json()["status"] == "running"


def test_log_followers_are_answered_from_memory_and_end_with_their_job(
    api: tuple[TestClient, JobCache], worker_db: Engine
) -> None:
    """Open streams take no connection from the API's pool between their checks: the job's
    status comes from memory, refreshed by the notification when a worker finishes it."""
    import threading

    client, cache = api
    job_id = add_job(client)
    pool = client.app.state.session_factory.kw["bind"].pool  # type: ignore[attr-defined]
    ended: list[str] = []

    def follow() -> None:
        with client.stream("GET", f"/jobs/{job_id}/logs?follow=true") as response:
            ended.append(str(response.status_code) + response.read().decode())

    streams = [threading.Thread(target=follow) for _ in range(8)]
    for stream in streams:
        stream.start()
    time.sleep(1.5)  # three checks each
    misses = cache.misses
    assert pool.checkedout() == 0
    time.sleep(1.0)
    assert cache.misses == misses, "the streams' checks read the database"
    with worker_db.begin() as conn:
        conn.execute(text("UPDATE jobs SET status = 'succeeded' WHERE id = :id"), {"id": job_id})
    for stream in streams:
        stream.join(10)
    assert ended == ["200"] * 8
