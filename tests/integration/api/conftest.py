"""Control-plane integration: real Postgres (migrated, own schema), real Redis, real
``celery worker`` processes and the real engine on the generated demo dataset.

Isolation: one Postgres schema and one queue-name prefix per test session (parallel runs
do not collide); every table is truncated before each test.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from maskops_api.main import create_app
from maskops_core.db.migrate import upgrade_head
from maskops_core.db.models import Base
from maskops_core.settings import Settings
from tests.support.extras import build_extra_venv, guard_env

if TYPE_CHECKING:
    from maskops.serving.launcher import TritonServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
CELERY = Path(sys.executable).with_name("celery")


@pytest.fixture(scope="session")
def api_settings(
    postgres_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    tag = uuid.uuid4().hex[:8]
    settings = Settings(
        database_url=postgres_url,
        database_schema=f"maskops_api_it_{tag}",
        broker_url=redis_url,
        queue_prefix=f"maskops-it-{tag}-",
        data_root=tmp_path_factory.mktemp("data_root"),
        heartbeat_interval_s=0.5,
        heartbeat_timeout_s=60,
        redispatch_after_s=0,
        cpu_ranks=2,
        _env_file=None,  # type: ignore[call-arg]
    )
    upgrade_head(settings)
    yield settings
    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{settings.database_schema}" CASCADE'))
    engine.dispose()
    client = redis.Redis.from_url(redis_url)
    for queue in (settings.gpu_queue, settings.cpu_queue):
        client.delete(queue)
    client.close()


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a worker process these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASKOPS_")}
    env.update(
        MASKOPS_DATABASE_URL=settings.database_url,
        MASKOPS_DATABASE_SCHEMA=settings.database_schema or "",
        MASKOPS_BROKER_URL=settings.broker_url,
        MASKOPS_QUEUE_PREFIX=settings.queue_prefix,
        MASKOPS_DATA_ROOT=str(settings.data_root),
        MASKOPS_HEARTBEAT_INTERVAL_S=str(settings.heartbeat_interval_s),
        MASKOPS_HEARTBEAT_TIMEOUT_S=str(settings.heartbeat_timeout_s),
        MASKOPS_TRITON_URL=settings.triton_url,
        MASKOPS_MODEL_REPOSITORY=str(settings.model_repository),
        MASKOPS_TRITON_NET_BACKEND=settings.triton_net_backend,
        MASKOPS_TRITON_DEVICE=settings.triton_device,
        MASKOPS_TRITON_GPUS=json.dumps(settings.triton_gpus),
        MASKOPS_TRITON_TENSORRT_VERSION=settings.triton_tensorrt_version,
        MASKOPS_TRITON_ENGINE_CACHE=settings.triton_engine_cache,
        MASKOPS_CPU_RANKS=str(settings.cpu_ranks),
        MASKOPS_RENDEZVOUS_TIMEOUT_S=str(settings.rendezvous_timeout_s),
        MASKOPS_REQUIRE_CUDA=str(int(settings.require_cuda)),
        OMP_NUM_THREADS="1",
    )
    return env


@pytest.fixture
def clean_db(api_settings: Settings) -> Settings:
    engine = create_engine(
        api_settings.database_url,
        connect_args={"options": f"-csearch_path={api_settings.database_schema}"},
    )
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()
    client = redis.Redis.from_url(api_settings.broker_url)
    for queue in (api_settings.gpu_queue, api_settings.cpu_queue):
        client.delete(queue)
    client.close()
    # Ids restart with the tables, so job and dataset folders must go with them.
    for folder in ("jobs", "datasets", "uploads"):
        shutil.rmtree(api_settings.data_root / folder, ignore_errors=True)
    return api_settings


@pytest.fixture
def client(clean_db: Settings) -> Iterator[TestClient]:
    with TestClient(base_url="http://localhost", app=create_app(clean_db)) as test_client:
        yield test_client


def stop_group(process: subprocess.Popen[bytes] | None, *, grace_s: float = 30) -> None:
    """SIGTERM the process group of ``process`` (started in a session of its own), then
    SIGKILL it if it outlives ``grace_s``."""
    from maskops.training.launcher import stop_process_group

    if process is not None:
        stop_process_group(process, grace_s=grace_s)


class Worker:
    """A real ``celery worker`` process (its own process group, so SIGKILL takes it all)
    that can import only what the worker image installs (the ``worker`` extra)."""

    def __init__(self, settings: Settings, log_dir: Path, name: str) -> None:
        self.settings = settings
        self.log_path = log_dir / f"{name}.log"
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        queues = f"{self.settings.gpu_queue},{self.settings.cpu_queue}"
        command = [
            str(CELERY), "-A", "maskops_worker.celery_app:app", "worker", "-Q", queues,
            "-c", "1", "--prefetch-multiplier", "1", "-n", f"{self.name}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
        ]  # fmt: skip
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            env=guard_env("worker", settings_env(self.settings)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        stop_group(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def workers(clean_db: Settings, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """``start(name, settings=clean_db)`` starts a worker; all are stopped afterwards."""
    started: list[Worker] = []

    def start(name: str = "w1", settings: Settings | None = None) -> Worker:
        worker = Worker(settings or clean_db, tmp_path, name).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def demo_root(api_settings: Settings) -> str:
    """The demo dataset under the data root (``demo/``): 16 train + 4 val images, 128 px."""
    from maskops.data.demo import generate_demo_dataset

    generate_demo_dataset(
        api_settings.data_root / "demo",
        num_images=20,
        image_size=(128, 128),
        seed=0,
        val_fraction=0.2,
    )
    return "demo"


def wait_for(
    client: httpx.Client,
    job_id: int,
    statuses: set[str],
    *,
    timeout: float = 240,
    worker: Worker | None = None,
    until: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """Poll ``GET /jobs/{id}`` until its status is in ``statuses`` (and ``until`` holds)."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] in statuses and (until is None or until(job)):
            return job
        time.sleep(0.2)
    logs = client.get(f"/jobs/{job_id}/logs").text
    raise AssertionError(
        f"job {job_id} still {job.get('status')} after {timeout}s: {job}\n--- job log\n{logs}"
        + (f"\n--- worker log\n{worker.log()[-5000:]}" if worker else "")
    )


@pytest.fixture(scope="session")
def api_extra_python() -> Path:
    """The API image's environment: a virtualenv with exactly the ``api`` extra (no torch,
    no onnx), built by the command its Dockerfile runs; kept in .venv-api between runs."""
    return build_extra_venv("api", REPO / ".venv-api")


class ApiProcess:
    """``python -m maskops_api.server`` (the API container's command) from ``python``, on a
    free loopback port; ``env`` adds settings (``MASKOPS_AUTH=required``, say)."""

    def __init__(
        self, python: Path, settings: Settings, work_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.python, self.settings, self.work_dir = python, settings, work_dir
        self.extra_env = env or {}
        self.log_path = work_dir / "api.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout_s: float = 60) -> httpx.Client:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = settings_env(self.settings)
        env.update(
            MASKOPS_HOST="127.0.0.1",
            MASKOPS_PORT=str(port),
            MASKOPS_MIGRATIONS_DIR=str(REPO / "migrations"),
        )
        env.update(self.extra_env)
        with self.log_path.open("ab") as log:
            # Not the repository as working directory: the API must run from what the
            # virtualenv installed, not from source files that happen to be importable.
            self.process = subprocess.Popen(
                [str(self.python), "-m", "maskops_api.server"],
                cwd=self.work_dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the API exited: {self.log_path.read_text()[-3000:]}")
            try:
                if client.get("/healthz").status_code == 200:
                    return client
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the API did not start: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        stop_group(self.process)


@contextlib.contextmanager
def api_with_tritons(
    settings: Settings, work_dir: Path, python: Path, monkeypatch: pytest.MonkeyPatch, count: int
) -> Iterator[tuple[httpx.Client, Settings, list[TritonServer]]]:
    """The API from ``python`` (the ``api`` extra's virtualenv) with ``count`` real Triton
    replicas (the PyPI server) on one model repository under ``work_dir``, whose python
    models can import only what the ``triton`` extra installs. Yields the API's client,
    the settings (``triton_url`` lists the replicas) and the ``TritonServer``s."""
    from maskops.serving.launcher import TritonServer

    for key, value in guard_env("triton", {}).items():
        monkeypatch.setenv(key, value)  # the servers' environment is the test process's
    repository = work_dir / "model_repository"
    repository.mkdir()
    with contextlib.ExitStack() as started:
        servers = [
            started.enter_context(
                TritonServer(repository, models=(), log_file=work_dir / f"triton{index}.log")
            )
            for index in range(count)
        ]
        urls = ",".join(server.http_url for server in servers)
        served = settings.model_copy(update={"triton_url": urls, "model_repository": repository})
        api = ApiProcess(python, served, work_dir)
        started.callback(api.stop)
        client = api.start()
        started.callback(client.close)
        yield client, served, servers
