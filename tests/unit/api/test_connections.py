"""Database connections and identifiers under load, against a real uvicorn process on the
embedded stack's SQLite database: log followers hold no connection while they wait and are
bounded, concurrent submissions sharing an ``Idempotency-Key`` answer quickly with one job,
a pool timeout is a 503, and ids are never given out again after a delete."""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text, update
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.main import create_app
from maskops_core import job_state
from maskops_core.db.models import Dataset, Job, JobStatus
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.support.control_plane import make_settings
from tests.unit.api.conftest import DATASET_BODY, SMALL_SPEC, RecordingDispatcher

REPO = Path(__file__).resolve().parents[3]
MAX_FOLLOWERS = 24
"""The API's bound on concurrent log streams in these tests (more than the SQLite pool's
5 + 10 connections, so a stream that held one would exhaust it)."""


@dataclass
class Server:
    url: str
    settings: Settings
    log: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``uvicorn maskops_api.main:app`` on a migrated SQLite database, with the pool
    SQLAlchemy gives SQLite by default (5 + 10 connections) and a 3 s pool timeout."""
    root = tmp_path_factory.mktemp("served")
    settings = make_settings(root)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASKOPS_")}
    env |= {
        "MASKOPS_DATABASE_URL": settings.database_url,
        "MASKOPS_BROKER_URL": "memory://",
        "MASKOPS_DATA_ROOT": str(settings.data_root),
        "MASKOPS_QUEUE_PREFIX": settings.queue_prefix,
        "MASKOPS_MAX_LOG_FOLLOWERS": str(MAX_FOLLOWERS),
        "MASKOPS_DATABASE_POOL_SIZE": "5",
        "MASKOPS_DATABASE_MAX_OVERFLOW": "10",
        "MASKOPS_DATABASE_POOL_TIMEOUT_S": "3",
    }
    log = root / "uvicorn.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "maskops_api.main:app", "--port", str(port)],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield Server(url, settings, log)
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture
def server(served: Server) -> Server:
    return served


@pytest.fixture
def served_db(served: Server) -> Iterator[sessionmaker[Session]]:
    """Sessions on the served database (what a worker writes with)."""
    engine = make_engine(served.settings)
    yield make_session_factory(engine)
    engine.dispose()


def _experiment(url: str, factory: sessionmaker[Session]) -> tuple[int, int]:
    """A registered dataset (its convert job left queued, the dataset marked converted) and
    an experiment on it."""
    with httpx.Client(base_url=url, timeout=30) as client:
        dataset = client.post("/datasets", json=DATASET_BODY).json()
        with factory() as s, s.begin():
            s.execute(update(Dataset).where(Dataset.id == dataset["id"]).values(shards_dir="x"))
        body = {"name": "e", "dataset_id": dataset["id"], "spec": SMALL_SPEC}
        experiment = client.post("/experiments", json=body).json()
    return int(experiment["id"]), int(dataset["convert_job_id"])


async def _followers(
    url: str, job_id: int, count: int, end_job: Callable[[], None]
) -> tuple[list[int], list[str]]:
    """Open ``count`` concurrent ``?follow=true`` streams; while they are open, time other
    requests; then end the job, and the streams must end too. Returns each stream's status
    code and a line per slow or failed request."""
    problems: list[str] = []
    opened: asyncio.Queue[int] = asyncio.Queue()
    limits = httpx.Limits(max_connections=count + 10)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def follow() -> None:
            async with client.stream("GET", f"/jobs/{job_id}/logs?follow=true") as response:
                await opened.put(response.status_code)
                async for _ in response.aiter_bytes():
                    pass

        tasks = [asyncio.create_task(follow()) for _ in range(count)]
        codes = [await opened.get() for _ in range(count)]
        await asyncio.sleep(1.5)  # the streams' checks run meanwhile
        for path in ("/experiments/1", "/jobs", "/datasets/1", "/experiments/1"):
            started = time.monotonic()
            response = await client.get(path)
            took = time.monotonic() - started
            if response.status_code != 200 or took > 2:
                problems.append(f"GET {path}: {response.status_code} in {took:.1f} s")
        await asyncio.to_thread(end_job)
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        except TimeoutError:
            problems.append("the streams went on after their job ended")
    return codes, problems


def test_log_followers_hold_no_connection_and_are_bounded(
    server: Server, served_db: sessionmaker[Session]
) -> None:
    # The dataset's convert job stays queued (no worker) until the test ends it.
    _, job_id = _experiment(server.url, served_db)
    end = functools.partial(_finish, served_db, job_id)
    codes, problems = asyncio.run(_followers(server.url, job_id, MAX_FOLLOWERS + 4, end))
    assert not problems, problems
    assert codes.count(200) == MAX_FOLLOWERS and codes.count(429) == 4, codes
    assert "QueuePool" not in server.log.read_text()


def test_a_bounded_stream_is_refused_with_a_message(
    server: Server, served_db: sessionmaker[Session]
) -> None:
    _, job_id = _experiment(server.url, served_db)

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            streams = [
                client.stream("GET", f"/jobs/{job_id}/logs?follow=true")
                for _ in range(MAX_FOLLOWERS)
            ]
            for stream in streams:
                assert (await stream.__aenter__()).status_code == 200
            refused = await client.get(f"/jobs/{job_id}/logs?follow=true")
            for stream in streams:
                await stream.__aexit__(None, None, None)
            return refused

    refused = asyncio.run(run())
    assert refused.status_code == 429
    assert "MASKOPS_MAX_LOG_FOLLOWERS" in refused.json()["detail"]
    assert refused.headers["retry-after"]
    # Closed streams give their slots back.
    deadline = time.monotonic() + 10
    while True:
        with httpx.stream("GET", f"{server.url}/jobs/{job_id}/logs?follow=true") as again:
            if again.status_code == 200:
                break
        assert time.monotonic() < deadline, "the closed streams kept their slots"
        time.sleep(0.2)


CLIENTS = 60
"""More than the API's 40 worker threads: retries that held a connection while waiting for a
thread, behind others that waited for a connection, stalled the pool until it timed out."""


async def _submit_all(url: str, experiment_id: int) -> list[tuple[int, int | None, float]]:
    body = {"action": "train", "experiment_id": experiment_id}
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def submit() -> tuple[int, int | None, float]:
            started = time.monotonic()
            response = await client.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
            job_id = response.json().get("id") if response.status_code == 202 else None
            return response.status_code, job_id, time.monotonic() - started

        return await asyncio.gather(*(submit() for _ in range(CLIENTS)))


def test_concurrent_submissions_sharing_a_key_answer_quickly_with_one_job(
    server: Server, served_db: sessionmaker[Session]
) -> None:
    experiment_id, _ = _experiment(server.url, served_db)
    results = asyncio.run(_submit_all(server.url, experiment_id))
    codes = sorted({code for code, _, _ in results})
    assert set(codes) <= {202, 409}, results
    assert len({job for _, job, _ in results if job is not None}) == 1, results
    assert max(took for _, _, took in results) < 10, sorted(t for _, _, t in results)[-5:]
    listed = httpx.get(f"{server.url}/jobs?action=train").json()
    assert listed["total"] == 1


def test_a_pool_timeout_is_a_503_with_retry_after(settings: Settings) -> None:
    tight = settings.model_copy(
        update={"database_pool_size": 1, "database_max_overflow": 0, "database_pool_timeout_s": 0.2}
    )
    with TestClient(
        create_app(tight, dispatcher=RecordingDispatcher()), base_url="http://localhost"
    ) as client:
        engine = client.app.state.session_factory.kw["bind"]  # type: ignore[attr-defined]
        with engine.connect():  # the pool's only connection, held
            response = client.get("/experiments")
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert "busy" in response.json()["detail"]


def _finish(factory: sessionmaker[Session], job_id: int) -> None:
    """What a worker does: claim the job and record it succeeded."""
    job = job_state.claim(factory, job_id, owner="w", worker_id="w")
    assert job is not None
    assert job_state.finish(factory, job_id, owner="w", status=JobStatus.succeeded, error=None)


def test_ids_are_never_reused_after_a_delete(
    client: TestClient, factory: sessionmaker[Session], settings: Settings
) -> None:
    first = client.post("/datasets", json=DATASET_BODY).json()
    job_id = first["convert_job_id"]
    _finish(factory, job_id)
    (settings.jobs_dir / str(job_id)).mkdir(parents=True)
    (settings.jobs_dir / str(job_id) / "job.log").write_text("the deleted job's log\n")
    assert client.delete(f"/datasets/{first['id']}").status_code == 204
    second = client.post("/datasets", json=DATASET_BODY).json()
    assert second["id"] > first["id"]
    assert second["convert_job_id"] > job_id
    assert client.get(f"/jobs/{second['convert_job_id']}/logs").text == ""
    with factory() as session:
        tables = session.execute(
            text("SELECT name FROM sqlite_master WHERE sql LIKE '%AUTOINCREMENT%'")
        ).scalars()
        assert {"datasets", "jobs", "experiments", "models", "job_metrics"} <= set(tables)


def test_a_replayed_publish_key_after_its_job_is_deleted_publishes_again(
    client: TestClient, factory: sessionmaker[Session]
) -> None:
    dataset = client.post("/datasets", json=DATASET_BODY).json()
    with factory() as s, s.begin():
        s.execute(update(Dataset).where(Dataset.id == dataset["id"]).values(shards_dir="x"))
    body = {"name": "e", "dataset_id": dataset["id"], "spec": SMALL_SPEC}
    experiment = client.post("/experiments", json=body).json()
    train = client.post("/jobs", json={"action": "train", "experiment_id": experiment["id"]})
    _finish(factory, train.json()["id"])
    export = client.post("/jobs", json={"action": "export", "parent_job_id": train.json()["id"]})
    _finish(factory, export.json()["id"])
    key = {"Idempotency-Key": "publish-1"}
    publish = {"job_id": export.json()["id"]}
    published = client.post("/models/m/publish", json=publish, headers=key)
    assert published.status_code == 202, published.text
    publish_job = published.json()["id"]
    with factory() as s, s.begin():  # the publish job failed: nothing refers to it
        s.execute(update(Job).where(Job.id == publish_job).values(status=JobStatus.failed))
    assert client.delete(f"/jobs/{publish_job}").status_code == 204
    again = client.post("/models/m/publish", json=publish, headers=key)
    assert again.status_code == 202, again.text
    assert again.json()["id"] > publish_job
    assert again.json()["action"] == "publish"


def test_migrating_an_existing_sqlite_database_keeps_its_rows(tmp_path: Path) -> None:
    """Migration 0007 recreates every table with an id: rows, ids and foreign keys (with
    their ON DELETE actions) survive, and the newest id is not given out again."""
    from alembic import command
    from alembic.config import Config

    from maskops_core.db.migrate import migrations_dir, upgrade_head

    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'old.db'}",
        _env_file=None,  # type: ignore[call-arg]
    )
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["configure_logger"] = False
    engine = make_engine(settings)
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0006")
        conn.commit()
    row = "'{}', 'q', 0, 0, '2026-01-01', '2026-01-01'"
    with engine.begin() as conn:
        for job_id, parent in ((1, "NULL"), (2, "1"), (3, "NULL")):
            conn.execute(
                text(
                    "INSERT INTO jobs (id, action, status, parent_job_id, options, queue, "
                    f"attempts, dispatch_count, created_at, updated_at) "
                    f"VALUES ({job_id}, 'train', 'succeeded', {parent}, {row})"
                )
            )
        conn.execute(
            text(
                'INSERT INTO job_metrics (job_id, step, "values", created_at) '
                "VALUES (2, 1, '{}', '2026-01-01')"
            )
        )
        conn.execute(text("DELETE FROM jobs WHERE id = 3"))
    engine.dispose()
    upgrade_head(settings)
    engine = make_engine(settings)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT id, parent_job_id FROM jobs")).all() == [
            (1, None),
            (2, 1),
        ]
        conn.execute(text("DELETE FROM jobs WHERE id = 2"))  # its metrics go with it
        assert conn.execute(text("SELECT count(*) FROM job_metrics")).scalar() == 0
        conn.execute(
            text(
                "INSERT INTO jobs (action, status, options, queue, attempts, dispatch_count, "
                "created_at, updated_at) VALUES ('train', 'queued', '{}', 'q', 0, 0, "
                "'2026-01-01', '2026-01-01')"
            )
        )
        assert conn.execute(text("SELECT max(id) FROM jobs")).scalar() == 3
    engine.dispose()


def test_migration_0010_marks_trial_versions_on_sqlite(tmp_path: Path) -> None:
    from tests.support.experiment_versions import check_migration_0010

    check_migration_0010(
        Settings(
            database_url=f"sqlite:///{tmp_path / 'old.db'}",
            _env_file=None,  # type: ignore[call-arg]
        )
    )


def test_jobs_queued_under_the_shared_embedded_queues_move_to_the_stacks_own(
    tmp_path: Path,
) -> None:
    """Jobs a ``maskops serve`` queued before stacks were told apart (queue names every
    state dir shared) are sent again to this stack's queues at start."""
    from maskops_core.db.migrate import upgrade_head
    from maskops_core.db.models import utcnow
    from maskops_serve.embedded import (
        LEGACY_QUEUE_PREFIX,
        EmbeddedConfig,
        adopt_legacy_queues,
        embedded_settings,
        requeue_orphans,
    )

    settings = embedded_settings(EmbeddedConfig(state_dir=tmp_path, use_redis=False))
    assert settings.stack_id in settings.gpu_queue
    upgrade_head(settings)
    engine = make_engine(settings)
    with make_session_factory(engine)() as session, session.begin():
        for status in (JobStatus.queued, JobStatus.succeeded):
            session.add(
                Job(
                    action="train",
                    status=status,
                    options={},
                    queue=f"{LEGACY_QUEUE_PREFIX}gpu",
                    dispatched_at=utcnow(),
                    task_id="maskops-job-1-1",
                    dispatch_count=1,
                )
            )
    engine.dispose()
    assert adopt_legacy_queues(settings) == 1
    dispatcher = RecordingDispatcher()
    requeue_orphans(settings, dispatcher)
    assert dispatcher.sent == [("train", 1, settings.gpu_queue, "maskops-job-1-2")]
    assert adopt_legacy_queues(settings) == 0
