"""``maskops serve``: the whole stack in the foreground on this machine.

SQLite for the database, a broker needing no server (Celery's SQLAlchemy transport on a
SQLite file; Redis when one answers on 127.0.0.1:6379), the API (uvicorn), one real Celery
worker process consuming both queues, and Triton from the PyPI wheel when it can start;
both are restarted when they die (:mod:`maskops_serve.supervisor`). The demo dataset is
generated and registered; ``--demo`` then walks the whole workflow over HTTP. Ctrl-C or
SIGTERM stops everything (worker and Triton included).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import update

from maskops.atomic import atomic_write
from maskops.process_groups import dies_with_parent, group_members, kill_group
from maskops.serving.control import (
    CONTROL_KEY_ENV,
    check_control_key,
    new_control_key,
    restricted_api_argument,
)
from maskops.serving.placement import ServingChoice
from maskops_api.reconciler import reconcile
from maskops_core import leftovers
from maskops_core.db.migrate import upgrade_head
from maskops_core.db.models import Job, JobStatus, utcnow
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.dispatch import CeleryDispatcher, Dispatcher
from maskops_core.settings import Settings
from maskops_serve.demo import DEMO_DATA_VERSION, DEMO_STEPS, generate_walk_dataset
from maskops_serve.state_lock import StateDirLock
from maskops_serve.supervisor import Supervision, TritonSupervisor, WorkerSupervisor

DEMO_STAMP = "VERSION"
"""In the demo dataset's folder: which recipe's data it holds."""
ADMIN_TOKEN_FILE = "admin-token"
"""Under the state dir: the stack's admin token (mode 0600), kept across starts."""
ADMIN_TOKEN_DAYS = 30
CHILDREN_FILE = "children.json"
LEGACY_QUEUE_PREFIX = "maskops-embedded-"
"""The queue prefix of every embedded stack before stacks were told apart; each stack's
queues now start with it followed by the stack id."""


@dataclass(frozen=True)
class EmbeddedConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    state_dir: Path = Path(".maskops")
    demo: bool = False
    demo_steps: int = DEMO_STEPS
    """Training steps of the walk (``--demo-steps``)."""
    use_redis: bool | None = None
    """None: use Redis when one answers on 127.0.0.1:6379."""
    triton: bool = True
    new_token: bool = False
    """Replace the stored admin token (the old one is revoked) even if it is still live."""


def redis_reachable(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def embedded_settings(config: EmbeddedConfig) -> Settings:
    state = config.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    use_redis = redis_reachable() if config.use_redis is None else config.use_redis
    broker = "redis://127.0.0.1:6379/0" if use_redis else f"sqla+sqlite:///{state / 'broker.db'}"
    stack = stack_id(state)
    return Settings(
        database_url=f"sqlite:///{state / 'maskops.db'}",
        broker_url=broker,
        stack_id=stack,
        queue_prefix=f"{LEGACY_QUEUE_PREFIX}{stack}-",
        data_root=state / "data",
        model_repository=state / "model_repository",
        host=config.host,
        # Without Redis the reconciler cannot see the queue; re-send only long-queued jobs.
        redispatch_after_s=30 if use_redis else 600,
        heartbeat_interval_s=2,
        heartbeat_timeout_s=60,
        # One worker of EMBEDDED_CONCURRENCY slots runs controllers and trials alike.
        max_running_searches=EMBEDDED_CONCURRENCY - 1,
        _env_file=None,  # type: ignore[call-arg]
    )


def with_serving_choice(settings: Settings) -> tuple[Settings, ServingChoice]:
    """Where this stack's Triton (the PyPI server, which has no TensorRT) runs published
    networks: the torch backend on the GPU when torch can use one, else the CPU
    (:func:`maskops.serving.placement.choose_serving`); said at start, never silent."""
    from maskops.serving.placement import choose_serving, torch_cuda_device

    cuda, why = torch_cuda_device()
    choice = choose_serving(tensorrt=False, cuda=cuda, no_cuda_why=why)
    if choice.device == "cpu":
        return settings, choice
    changes = {"triton_device": "gpu", "triton_net_backend": choice.net_backend}
    return settings.model_copy(update=changes), choice


def stack_id(state_dir: Path) -> str:
    """The stack's name on a shared broker: ``embedded-`` and a hash of the resolved state
    dir (two ``maskops serve`` on one Redis are two stacks, one state dir is one stack)."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return f"embedded-{digest}"


def adopt_legacy_queues(settings: Settings) -> int:
    """Point the jobs of the queue names every state dir once shared at this stack's own
    queues; the queued ones are marked never sent, so that the reconciler's pass at start
    sends them there. Returns the number of queued jobs moved."""
    engine = make_engine(settings)
    moved = 0
    try:
        with engine.begin() as conn:
            for kind, queue in (("gpu", settings.gpu_queue), ("cpu", settings.cpu_queue)):
                legacy = Job.queue == f"{LEGACY_QUEUE_PREFIX}{kind}"
                queued = conn.execute(
                    update(Job)
                    .where(legacy, Job.status == JobStatus.queued)
                    .values(queue=queue, dispatched_at=None)
                )
                moved += queued.rowcount
                conn.execute(update(Job).where(legacy).values(queue=queue))
    finally:
        engine.dispose()
    return moved


def settings_environment(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process (the worker) the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASKOPS_")}
    for name, value in settings.model_dump(mode="json").items():
        if value is not None:
            # Lists as JSON, which is how pydantic-settings reads them back.
            text = json.dumps(value) if isinstance(value, list | dict) else str(value)
            env[f"MASKOPS_{name.upper()}"] = text
    return env


EMBEDDED_CONCURRENCY = 2
"""Jobs the embedded stack's one worker runs at once."""


def start_worker(settings: Settings, log_file: Path) -> subprocess.Popen[bytes]:
    queues = f"{settings.gpu_queue},{settings.cpu_queue}"
    celery = Path(sys.executable).with_name("celery")
    # Two jobs at once: an AutoML search's controller holds one slot for the whole search
    # while its trials train in the other (one worker serves both queues here); a second
    # search waits unsent (max_running_searches) rather than take the trials' slot.
    command = [
        str(celery), "-A", "maskops_worker.celery_app:app", "worker", "-Q", queues,
        "-c", str(EMBEDDED_CONCURRENCY), "--prefetch-multiplier", "1", "-n", "embedded@%h",
        "--without-gossip", "--without-mingle", "-l", "INFO",
    ]  # fmt: skip
    handle = log_file.open("ab")
    # SIGKILL when serve dies without stopping it: nobody is left to wait for a warm
    # shutdown, Celery's pool processes die with their main process (their own death
    # signal) and a training's ranks with theirs; the next start requeues the job.
    return subprocess.Popen(
        command,
        env=settings_environment(settings),
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=dies_with_parent(signal.SIGKILL),
    )


def stop_worker(process: subprocess.Popen[bytes], *, grace_s: float = 5) -> None:
    """Celery's warm shutdown (SIGTERM to the main process) for an idle worker; a job still
    running after ``grace_s`` is killed with its process group and resumes from its last
    checkpoint on the next start (see :func:`requeue_orphans`)."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def requeue_orphans(settings: Settings, dispatcher: Dispatcher) -> list[int]:
    """Jobs left running by the previous run of this stack: its only worker is gone, so
    they are requeued now rather than after the heartbeat timeout."""
    from datetime import timedelta

    engine = make_engine(settings)
    try:
        report = reconcile(
            make_session_factory(engine),
            dispatcher,
            settings,
            now=utcnow() + timedelta(seconds=settings.heartbeat_timeout_s + 1),
        )
    finally:
        engine.dispose()
    return report.requeued


def triton_supervisor(
    settings: Settings, log_file: Path, say: Callable[[str], None]
) -> TritonSupervisor | None:
    """Triton on ports fixed for the life of the stack (the API and the worker keep one
    URL across restarts), loading only published models; None without the launcher."""
    try:
        from maskops.serving.launcher import TritonServer, free_port
    except ImportError:
        say("triton: launcher not available in this build; /infer is disabled")
        return None
    settings.model_repository.mkdir(parents=True, exist_ok=True)
    http_port, metrics_port = free_port(), free_port()
    restricted_api = restricted_api_argument(settings.triton_control_key)

    def make_server() -> Any:
        # models=[]: nothing loads at start; the supervisor loads what is published.
        # Loopback only, whatever the API's host: /infer reaches it from this machine.
        return TritonServer(
            settings.model_repository,
            models=[],
            http_port=http_port,
            metrics_port=metrics_port,
            host="127.0.0.1",
            restricted_api=restricted_api,
            log_file=log_file,
        )

    return TritonSupervisor(make_server, settings, say)


class ChildRecord:
    """``<state-dir>/children.json``: the process group of each child, so that the next
    start kills what a ``maskops serve`` that was itself killed (SIGKILL, OOM) left running."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / CHILDREN_FILE
        self._groups: dict[str, int] = {}
        self._lock = threading.Lock()

    def kill_leftovers(self, say: Callable[[str], None]) -> None:
        try:
            recorded = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        for what, pgid in recorded.items():
            # Only a group that is still ours: a member mentions this state dir.
            if any(self._mentions_state(pid) for pid in group_members(int(pgid))):
                say(f"{what.lower()}: killing process group {pgid}, left by an earlier run")
                kill_group(int(pgid))

    def _mentions_state(self, pid: int) -> bool:
        needle = str(self.state_dir).encode()
        for name in ("cmdline", "environ"):
            try:
                if needle in Path(f"/proc/{pid}/{name}").read_bytes():
                    return True
            except OSError:
                continue
        return False

    def record(self, what: str, pgid: int) -> None:
        with self._lock:
            self._groups[what] = pgid
            atomic_write(self.path, json.dumps(self._groups))


def ensure_demo_dataset(settings: Settings) -> Path:
    """The walk's demo dataset under the data root, rewritten when the recipe changed."""
    root = settings.data_root / "demo"
    stamp = root / DEMO_STAMP
    if not stamp.is_file() or stamp.read_text().strip() != DEMO_DATA_VERSION:
        # Images of an earlier recipe would linger beside the new ones (and the walk sends
        # the first validation image to /infer).
        shutil.rmtree(root / "images", ignore_errors=True)
        generate_walk_dataset(root)
        stamp.write_text(DEMO_DATA_VERSION + "\n")
    return root


def admin_token(settings: Settings, path: Path, *, renew: bool = False) -> tuple[str, bool]:
    """The stack's admin token and whether it was created now.

    The one stored at ``path`` while it is live, so that restarts do not pile up tokens;
    a new one, expiring in ``ADMIN_TOKEN_DAYS``, on the first start, when the stored one
    expired or was revoked, or with ``renew`` (the stored one is revoked then).
    """
    from maskops_api.services.tokens import create_token, find_token, revoke_secret
    from maskops_core.db.models import TokenScope

    stored = path.read_text().strip() if path.is_file() else ""
    engine = make_engine(settings)
    try:
        with make_session_factory(engine)() as session:
            if stored and not renew and find_token(session, stored) is not None:
                return stored, False
            if stored:
                revoke_secret(session, stored)
            _, secret = create_token(
                session,
                name="embedded admin",
                scope=TokenScope.admin,
                expires_in_days=ADMIN_TOKEN_DAYS,
            )
    finally:
        engine.dispose()
    # Written readable by the owner only, replacing the previous file in one step.
    atomic_write(path, secret + "\n", durable=True, mode=0o600)
    return secret, True


def announce_admin_token(
    settings: Settings, token_file: Path, *, renew: bool, say: Callable[[str], None]
) -> str:
    """:func:`admin_token`, saying where it is stored, never the secret itself (a
    terminal's output ends up in scrollback, CI logs and screen shares)."""
    token, created = admin_token(settings, token_file, renew=renew)
    made = f"created (admin, expires in {ADMIN_TOKEN_DAYS} days), " if created else ""
    say(f"token:    {made}stored in {token_file} (mode 0600; --new-token replaces it)")
    return token


def serve(config: EmbeddedConfig, *, say: Callable[[str], None] = print) -> int:
    """Run the stack in the foreground until Ctrl-C or SIGTERM; the demo's exit code."""
    import uvicorn

    from maskops_api.main import create_app

    # Before anything touches the state dir: a second server must not kill the first one's
    # children as leftovers, nor share its database.
    lock = StateDirLock(config.state_dir.resolve(), address=f"http://{config.host}:{config.port}")
    settings, dispatcher, children = _prepare_state(config, say)
    settings, supervision = _supervision(config, settings, dispatcher, children, say)
    token = None
    if settings.auth_required:
        # Listening beyond loopback: the demo (and the user) need a token.
        token_file = config.state_dir.resolve() / ADMIN_TOKEN_FILE
        token = announce_admin_token(settings, token_file, renew=config.new_token, say=say)
    app = create_app(settings, dispatcher=dispatcher, run_reconciler=True)
    app.state.supervisor = supervision
    server = uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=config.port, log_level="warning")
    )
    outcome: dict[str, int] = {}
    threading.Thread(
        target=_after_start,
        args=(server, config, settings, token, outcome, say),
        name="maskops-demo",
        daemon=True,
    ).start()
    try:
        _run_until_stopped(server, supervision)
    finally:
        say("stopping: worker" + (", triton" if supervision.triton is not None else ""))
        supervision.stop()
        lock.release()
    return outcome.get("code", 0)


def _prepare_state(
    config: EmbeddedConfig, say: Callable[[str], None]
) -> tuple[Settings, CeleryDispatcher, ChildRecord]:
    """Migrate the database, adopt jobs of the old shared queues, register the demo data,
    kill the children a previous run left, and requeue the jobs they were running."""
    settings, choice = with_serving_choice(embedded_settings(config))
    say(f"serving:  {choice.reason}")
    upgrade_head(settings)
    say(f"database: {settings.database_url}")
    say(f"broker:   {settings.broker_url} (stack {settings.stack_id})")
    if moved := adopt_legacy_queues(settings):
        say(f"queues:   {moved} queued jobs moved to this stack's {settings.queue_prefix}*")
    ensure_demo_dataset(settings)
    children = ChildRecord(config.state_dir.resolve())
    children.kill_leftovers(say)  # before their jobs are requeued
    # Nothing else writes under the data root now (the state dir's lock is ours).
    if swept := leftovers.sweep(settings.data_root):
        say(f"data:     removed {len(swept)} partial files left by killed uploads or writes")
    dispatcher = CeleryDispatcher(settings)
    requeued = requeue_orphans(settings, dispatcher)
    if requeued:
        say(f"resuming jobs interrupted by the last stop: {requeued}")
    return settings, dispatcher, children


def _supervision(
    config: EmbeddedConfig,
    settings: Settings,
    dispatcher: CeleryDispatcher,
    children: ChildRecord,
    say: Callable[[str], None],
) -> tuple[Settings, Supervision]:
    """The worker's and Triton's supervisors (not started); the settings gain Triton's
    address."""
    logs = config.state_dir.resolve() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    settings = with_control_key(settings)
    triton = triton_supervisor(settings, logs / "triton.log", say) if config.triton else None
    if triton is not None:
        url = triton.make_server().http_url
        settings = settings.model_copy(update={"triton_url": url})
        say(f"triton:   http://{url} (starting; log {logs / 'triton.log'})")
    worker_settings = settings

    def launch_worker() -> subprocess.Popen[bytes]:
        process = start_worker(worker_settings, logs / "worker.log")
        say(f"worker:   pid {process.pid} (log {logs / 'worker.log'})")
        return process

    def requeue_lost() -> None:
        if lost := requeue_orphans(worker_settings, dispatcher):
            say(f"worker: requeued the jobs it was running: {lost}")

    supervision = Supervision(
        WorkerSupervisor(launch_worker, stop_worker, requeue_lost, say), triton
    )
    for child in (supervision.worker, triton):
        if child is not None:
            child.on_launch = children.record
    return settings, supervision


def with_control_key(settings: Settings) -> Settings:
    """``settings`` with a Triton model-control key (the operator's, else a fresh one for
    this start), also in this process's environment, where the in-process API's client
    reads it; the worker gets it with the rest of the settings."""
    key = check_control_key(settings.triton_control_key or new_control_key())
    os.environ[CONTROL_KEY_ENV] = key
    return settings.model_copy(update={"triton_control_key": key})


def _after_start(
    server: Any,
    config: EmbeddedConfig,
    settings: Settings,
    token: str | None,
    outcome: dict[str, int],
    say: Callable[[str], None],
) -> None:
    """Once the API listens: register the demo dataset and, with ``--demo``, walk it."""
    from maskops_serve.demo import register_demo_dataset, run_demo

    while not server.started and not server.should_exit:
        threading.Event().wait(0.1)
    if server.should_exit:
        return
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    base_url = f"http://{host}:{config.port}"
    say(f"API:      {base_url}  (Swagger UI: {base_url}/docs)")
    try:
        dataset_id = register_demo_dataset(base_url, token=token, say=say)
        if config.demo:
            outcome["code"] = run_demo(
                base_url,
                dataset_id,
                data_root=settings.data_root,
                out_dir=config.state_dir.resolve(),
                token=token,
                steps=config.demo_steps,
                say=say,
            )
            say("demo finished; the stack keeps running (Ctrl-C to stop)")
    except Exception as exc:
        say(f"demo: failed: {exc}")
        outcome["code"] = 1


def _run_until_stopped(server: Any, supervision: Supervision) -> None:
    """Serve until SIGINT or SIGTERM. uvicorn shuts down on them and then re-raises the
    signal with the handler it found; with these recording handlers that re-raise returns
    here, so the caller stops the worker and Triton instead of orphaning them."""
    stop_signals: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: stop_signals.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    supervision.start()
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
