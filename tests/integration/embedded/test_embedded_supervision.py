"""``maskops serve`` supervises what it starts: a worker or tritonserver killed
with SIGKILL comes back, is reaped, leaves no process of its group behind, queued jobs run,
``/readyz`` is 503 naming what is down meanwhile; Triton loads published models only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from maskops.process_groups import group_members
from maskops.serving.control import CONTROL_HEADER, CONTROL_KEY_ENV
from maskops_core.db.migrate import upgrade_head
from maskops_core.db.models import Job, JobStatus, PublishedModel
from maskops_core.db.session import make_engine, make_session_factory
from maskops_serve.embedded import CHILDREN_FILE, EmbeddedConfig, embedded_settings
from tests.support.triton_toy import toy_model

pytestmark = pytest.mark.integration
pytest.importorskip("pytriton")

MASKOPS = Path(sys.executable).with_name("maskops")
CONTROL_KEY = "embedded-stack-test-key"
"""Serve takes the operator's key from its environment (else it makes one)."""


def _prepare_state(state: Path) -> None:
    """A state dir whose repository holds a published and an unpublished model."""
    settings = embedded_settings(EmbeddedConfig(state_dir=state, use_redis=False))
    upgrade_head(settings)
    for name in ("toy_published", "toy_unpublished"):
        toy_model(settings.model_repository, name)
    engine = make_engine(settings)
    with make_session_factory(engine)() as session, session.begin():
        export = Job(action="export", status=JobStatus.succeeded, queue="gpu")
        session.add(export)
        session.flush()
        session.add(PublishedModel(name="toy_published", version=1, job_id=export.id))
        session.add(PublishedModel(name="toy_unpublished", version=1, job_id=export.id))
        session.flush()
        session.get_one(PublishedModel, 2).published = False
    engine.dispose()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, probe: Callable[[], Any], timeout_s: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s\n{log.read_text()[-4000:]}")


def _readyz(base: str) -> tuple[int, dict[str, str]]:
    try:
        response = httpx.get(f"{base}/readyz", timeout=10)
    except httpx.HTTPError:
        return 0, {}
    return response.status_code, response.json().get("checks", {})


def _children(pid: int, name: str) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[1]) == pid and comm.startswith(name):
            found.append(int(stat.parent.name))
    return found


def _model_states(triton: str) -> dict[str, str]:
    """The repository index, which serve's Triton lists only to the control key's holder."""
    url = f"http://{triton}/v2/repository/index"
    assert httpx.post(url, json={}, timeout=10).status_code == 403
    index = httpx.post(url, json={}, headers={CONTROL_HEADER: CONTROL_KEY}, timeout=10).json()
    return {entry["name"]: entry.get("state", "") for entry in index}


def _start_serve(state: Path, port: int, out: Path) -> subprocess.Popen[bytes]:
    with out.open("ab") as handle:
        return subprocess.Popen(
            [str(MASKOPS), "serve", "--port", str(port), "--state-dir", str(state), "--no-redis"],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", CONTROL_KEY_ENV: CONTROL_KEY},
        )


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path, list[int]]]:
    """serve's process, its URL, its output and a list of process groups (its children's)
    that must be empty once it stopped."""
    state = tmp_path / "state"
    _prepare_state(state)
    port = _free_port()
    out = tmp_path / "serve.out"
    process = _start_serve(state, port, out)
    groups: list[int] = []
    try:
        yield process, f"http://127.0.0.1:{port}", out, groups
    finally:
        if process.poll() is None:  # (a test may have killed it on purpose)
            groups += _children(process.pid, "")
            process.send_signal(signal.SIGTERM)
            assert process.wait(120) == 0, out.read_text()[-4000:]
        left = {pgid: members for pgid in groups if (members := group_members(pgid))}
        assert not left, f"processes outlived maskops serve: {left}"


def test_serve_restarts_a_killed_worker_and_triton(
    serve: tuple[subprocess.Popen[bytes], str, Path, list[int]],
) -> None:
    process, base, out, groups = serve
    _wait("ready", lambda: _readyz(base)[0] == 200, 300, out)
    assert _readyz(base)[1] == {"database": "ok", "worker": "ok", "broker": "ok", "triton": "ok"}
    triton = out.read_text().split("triton:   http://")[1].split()[0]
    states = _model_states(triton)
    assert states["toy_published"] == "READY"
    assert states.get("toy_unpublished") != "READY", states

    # tritonserver killed: 503 naming Triton, its stubs are killed, it comes back.
    [server] = _children(process.pid, "tritonserver")
    stubs = [pid for pid in group_members(server) if pid != server]
    assert stubs, "the published model runs no backend stub"
    groups.append(server)
    os.kill(server, signal.SIGKILL)
    # Within a poll of the supervisor (0.5 s) /readyz says "unreachable", then why.
    _wait(
        "503 naming Triton",
        lambda: (r := _readyz(base))[0] == 503 and "Triton" in r[1]["triton"],
        10,
        out,
    )
    _wait("stubs gone", lambda: not any(Path(f"/proc/{p}").exists() for p in stubs), 15, out)
    _wait("ready again", lambda: _readyz(base)[0] == 200, 180, out)
    states = _model_states(triton)
    assert states["toy_published"] == "READY" and states.get("toy_unpublished") != "READY"
    assert "triton: exited with code -9; restarting in" in out.read_text()

    # The worker's main process killed: reaped (no zombie), 503, back, a queued job runs.
    worker = int(out.read_text().split("worker:   pid ")[-1].split()[0])
    groups.append(worker)
    os.kill(worker, signal.SIGKILL)
    _wait(
        "503 naming the worker",
        lambda: (r := _readyz(base))[0] == 503 and "orker" in r[1]["worker"],
        10,
        out,
    )
    job = httpx.post(f"{base}/jobs", json={"action": "dataset_convert", "dataset_id": 1}).json()
    _wait("reaped", lambda: not Path(f"/proc/{worker}").exists(), 10, out)
    finished = _wait(
        "the queued job ran",
        lambda: httpx.get(f"{base}/jobs/{job['id']}").json()["status"] in ("succeeded", "failed"),
        180,
        out,
    )
    assert finished and httpx.get(f"{base}/jobs/{job['id']}").json()["status"] == "succeeded"
    _wait("ready again", lambda: _readyz(base)[0] == 200, 60, out)
    assert "worker: exited with code -9; restarting in" in out.read_text()


def test_a_killed_serve_takes_its_worker_and_triton_along(
    serve: tuple[subprocess.Popen[bytes], str, Path, list[int]], tmp_path: Path
) -> None:
    """A second serve on the same state dir is refused at once, naming the running one,
    and touches nothing of it. Then serve SIGKILLed (no chance to stop anything): its
    children, each in a session of its own, die with it (parent-death signals), the
    worker's pool process and Triton's backend stubs included."""
    process, base, out, groups = serve
    _wait("ready", lambda: _readyz(base)[0] == 200, 300, out)
    [server] = _children(process.pid, "tritonserver")
    worker = int(out.read_text().split("worker:   pid ")[-1].split()[0])

    second = _start_serve(tmp_path / "state", _free_port(), tmp_path / "second.out")
    assert second.wait(60) != 0
    refusal = (tmp_path / "second.out").read_text()
    assert f"in use by another maskops serve (pid {process.pid}, {base}," in refusal, refusal
    assert _children(process.pid, "tritonserver") == [server] and group_members(worker)
    assert _readyz(base)[0] == 200
    assert len(group_members(server)) >= 2, "the published model runs no backend stub"
    assert len(group_members(worker)) >= 2, "the worker runs no pool process"
    groups += [server, worker]
    process.kill()
    process.wait()
    _wait("every process gone", lambda: not any(map(group_members, groups)), 10, out)


def test_serve_kills_what_an_earlier_serve_left_running(tmp_path: Path) -> None:
    """A child that outlived its serve anyway (a platform without parent-death signals):
    the next start kills its recorded process group, when a member mentions the state."""
    state = tmp_path / "state"
    _prepare_state(state)
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", str(state.resolve())],
        start_new_session=True,
    )
    (state / CHILDREN_FILE).write_text(json.dumps({"Worker": leftover.pid}))
    out = tmp_path / "serve.out"
    again = _start_serve(state, _free_port(), out)
    try:
        _wait("leftover killed", lambda: leftover.poll() is not None, 60, out)
        assert "worker: killing process group" in out.read_text()
        # Stopped once serving and the demo dataset is registered (else it exits with 1).
        _wait("serving", lambda: "'demo-shapes' registered" in out.read_text(), 120, out)
    finally:
        groups = _children(again.pid, "")
        again.send_signal(signal.SIGTERM)
        assert again.wait(120) == 0, out.read_text()[-4000:]
        leftover.kill()
        left = {pgid: members for pgid in groups if (members := group_members(pgid))}
        assert not left, f"processes outlived maskops serve: {left}"
