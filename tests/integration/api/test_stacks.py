"""Two embedded stacks (``maskops serve`` settings for two state dirs) on one Redis, each
with its real Celery worker: each worker runs its own stack's jobs only, and a message
that names another stack goes back to the broker instead of being acknowledged. Stacks an
operator left without a stack id share queue names: the database a message names keeps
each worker to its own jobs all the same."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select

from maskops_api.main import create_app
from maskops_core.actions import JobAction
from maskops_core.db.migrate import upgrade_head
from maskops_core.db.models import Job, JobStatus
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.dispatch import CeleryDispatcher
from maskops_core.settings import Settings
from maskops_serve.embedded import EmbeddedConfig, embedded_settings, start_worker
from tests.integration.api.conftest import stop_group

pytestmark = pytest.mark.integration

DATASETS = 4
COCO = json.dumps({"images": [], "annotations": [], "categories": []})
BODY = {
    "name": "empty",
    "train": {"image_dir": "d/images", "annotation_file": "d/train.json"},
    "num_shards": 1,
}


def _stack(root: Path, redis_url: str) -> Settings:
    settings = embedded_settings(EmbeddedConfig(state_dir=root, use_redis=True))
    settings = settings.model_copy(update={"broker_url": redis_url})
    upgrade_head(settings)
    (settings.data_root / "d" / "images").mkdir(parents=True)
    (settings.data_root / "d" / "train.json").write_text(COCO)
    return settings


def _queue_job(settings: Settings) -> int:
    """A queued dataset_convert job in ``settings``' database, sent to no broker."""
    engine = make_engine(settings)
    with make_session_factory(engine)() as session, session.begin():
        job = Job(
            action=JobAction.dataset_convert,
            status=JobStatus.queued,
            options={},
            queue=settings.cpu_queue,
        )
        session.add(job)
        session.flush()
        job_id = job.id
    engine.dispose()
    return job_id


def _wait_for_line(log: Path, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)


@contextmanager
def _worker(settings: Settings, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = start_worker(settings, log)
    try:
        yield process
    finally:
        stop_group(process, grace_s=10)


def _statuses(settings: Settings) -> dict[int, str]:
    engine = make_engine(settings)
    try:
        with make_session_factory(engine)() as session:
            return {j.id: j.status for j in session.scalars(select(Job))}
    finally:
        engine.dispose()


def _forget_broker_keys(redis_url: str, *stacks: Settings) -> None:
    client = redis.Redis.from_url(redis_url)
    for settings in stacks:
        prefix = settings.broker_key_prefix
        for key in client.scan_iter(f"{prefix}*" if prefix else f"{settings.queue_prefix}*"):
            client.delete(key)
    client.close()


def test_two_stacks_on_one_redis_run_only_their_own_jobs(redis_url: str, tmp_path: Path) -> None:
    first, second = _stack(tmp_path / "a", redis_url), _stack(tmp_path / "b", redis_url)
    assert first.gpu_queue != second.gpu_queue and first.stack_id != second.stack_id
    try:
        with (
            _worker(second, tmp_path / "b.log"),
            _worker(first, tmp_path / "a.log"),
            TestClient(create_app(first), base_url="http://localhost") as client,
        ):
            for index in range(DATASETS):
                created = client.post("/datasets", json={**BODY, "name": f"d{index}"})
                assert created.status_code == 201, created.text
            deadline = time.monotonic() + 90
            while JobStatus.queued in _statuses(first).values():
                assert time.monotonic() < deadline, (
                    f"jobs left queued: {_statuses(first)}\nthe other stack's worker:\n"
                    + (tmp_path / "b.log").read_text()[-3000:]
                )
                time.sleep(0.5)
        assert "skipping this delivery" not in (tmp_path / "b.log").read_text()
        assert _statuses(second) == {}
    finally:
        _forget_broker_keys(redis_url, first, second)


def test_a_message_naming_another_stack_is_not_acknowledged(redis_url: str, tmp_path: Path) -> None:
    settings = _stack(tmp_path / "a", redis_url)
    job_id = _queue_job(settings)
    dispatcher = CeleryDispatcher(settings)
    client = redis.Redis.from_url(redis_url)
    prefix = settings.broker_key_prefix
    try:
        with _worker(settings, tmp_path / "a.log"):
            dispatcher.app.send_task(
                JobAction.dataset_convert.task_name,
                args=[job_id],
                kwargs={"stack": "another-stack"},
                queue=settings.cpu_queue,
            )
            _wait_for_line(tmp_path / "a.log", "back to the broker")
            time.sleep(2)
            # Still in the broker (waiting, or delivered again and not yet rejected).
            waiting = client.llen(prefix + settings.cpu_queue) + client.hlen(prefix + "unacked")
            assert waiting == 1
            assert _statuses(settings) == {job_id: JobStatus.queued}
        assert prefix and not list(client.scan_iter(settings.cpu_queue))
    finally:
        dispatcher.close()
        client.close()
        _forget_broker_keys(redis_url, settings)


def test_stacks_without_a_stack_id_never_run_each_others_jobs(
    redis_url: str, tmp_path: Path
) -> None:
    """Both databases hold a job 1; the second stack's worker, alone on the shared queue,
    gets the first stack's message for job 1 and must neither run its own job 1 nor
    acknowledge the message, which the first stack's worker runs once it starts."""
    unnamed = {"stack_id": "", "queue_prefix": "unnamed-stacks-"}
    first, second = (
        _stack(tmp_path / name, redis_url).model_copy(update=unnamed) for name in ("a", "b")
    )
    assert first.cpu_queue == second.cpu_queue and first.broker_key_prefix == ""
    others = _queue_job(second)
    try:
        with TestClient(create_app(first), base_url="http://localhost") as client:
            with _worker(second, tmp_path / "b.log"):
                created = client.post("/datasets", json=BODY)
                assert created.status_code == 201, created.text
                mine = created.json()["convert_job_id"]
                assert mine == others
                _wait_for_line(tmp_path / "b.log", "give each its own MASKOPS_STACK_ID")
                time.sleep(2)
                assert _statuses(second) == {others: JobStatus.queued}
                assert _statuses(first) == {mine: JobStatus.queued}
            with _worker(first, tmp_path / "a.log"):
                deadline = time.monotonic() + 60
                while _statuses(first)[mine] == JobStatus.queued:
                    assert time.monotonic() < deadline, (tmp_path / "a.log").read_text()[-3000:]
                    time.sleep(0.5)
        assert _statuses(second) == {others: JobStatus.queued}
        assert "skipping this delivery" not in (tmp_path / "b.log").read_text()
    finally:
        _forget_broker_keys(redis_url, first, second)
