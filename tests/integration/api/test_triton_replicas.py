"""Two real Triton replicas on one model repository behind the API (``MASKOPS_TRITON_URL``
lists both): a publish job lands on both, ``/infer`` takes turns between them (counted by
each server's inference statistics), a replica killed under load costs no request and
shows in ``/readyz`` and ``GET /models/{name}``, and a publish one replica cannot take is
undone on the other."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from maskops.serving import EnsembleNames, existing_versions
from maskops.serving import client as triton
from maskops_core.db.models import Job
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker, api_with_tritons, wait_for

if TYPE_CHECKING:
    from maskops.serving.launcher import TritonServer

pytestmark = pytest.mark.integration
pytest.importorskip("pytriton")

NAME = "shapes"
Files = list[tuple[str, tuple[str, bytes, str]]]


def _export_job(settings: Settings, onnx: Path) -> int:
    """A succeeded export job whose ONNX (the shared ``exported`` fixture) is in the data
    root: what a publish takes, without training and exporting again here."""
    target = settings.data_root / "exports" / "shapes.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(onnx, target)
    engine = make_engine(settings)
    try:
        with make_session_factory(engine)() as session, session.begin():
            job = Job(action="export", status="succeeded", queue="gpu", options={})
            job.result = {"onnx": "exports/shapes.onnx"}
            session.add(job)
            session.flush()
            return int(job.id)
    finally:
        engine.dispose()


def _inferences(url: str) -> int:
    """Requests the ensemble answered on the replica at ``url`` (Triton's statistics)."""
    stats = httpx.get(f"http://{url}/v2/models/{NAME}/stats", timeout=10).json()
    return sum(m["inference_stats"]["success"]["count"] for m in stats["model_stats"])


def test_two_replicas_publish_infer_and_lose_one(
    clean_db: Settings,
    tmp_path: Path,
    api_extra_python: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: Callable[..., Worker],
    exported: Path,
    demo_root: str,
) -> None:
    export_id = _export_job(clean_db, exported)
    image = sorted((clean_db.data_root / demo_root / "images" / "val").glob("*.jpg"))[0]
    files: Files = [("images", (image.name, image.read_bytes(), "image/jpeg"))]
    with api_with_tritons(clean_db, tmp_path, api_extra_python, monkeypatch, 2) as started:
        client, settings, servers = started
        first, second = (server.http_url for server in servers)
        worker = workers("w1", settings)

        published = client.post(f"/models/{NAME}/publish", json={"job_id": export_id})
        assert published.status_code == 202, published.text
        job = wait_for(client, published.json()["id"], {"succeeded", "failed"}, worker=worker)
        assert job["status"] == "succeeded", client.get(f"/jobs/{job['id']}/logs").text
        both = {first: "serves version 1", second: "serves version 1"}
        assert job["result"]["replicas"] == both
        for url in (first, second):
            assert {triton.served_version(url, m) for m in EnsembleNames(NAME).load_order} == {"1"}
        [version] = client.get(f"/models/{NAME}").json()
        assert version["replicas"] == {first: "READY", second: "READY"}
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["triton_replicas"] == {first: "ok", second: "ok"}

        # Round-robin: four requests, two on each replica.
        answers = [client.post("/infer", params={"model": NAME}, files=files) for _ in range(4)]
        assert all(a.status_code == 200 for a in answers), answers[0].text
        assert all(a.json() == answers[0].json() for a in answers)
        assert (_inferences(first), _inferences(second)) == (2, 2)

        _kill_under_load(client, files, servers[1])
        before = _inferences(first)
        for _ in range(3):
            assert client.post("/infer", params={"model": NAME}, files=files).status_code == 200
        assert _inferences(first) == before + 3
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.text
        assert ready.json()["checks"]["triton"].startswith("1 of 2 replicas ready")
        assert ready.json()["triton_replicas"][first] == "ok"
        assert ready.json()["triton_replicas"][second].startswith("unreachable")
        [version] = client.get(f"/models/{NAME}").json()
        assert version["replicas"][first] == "READY"
        assert "not reachable" in version["replicas"][second]

        _publish_is_undone_everywhere(client, settings, export_id, worker, first, second)

        os.killpg(servers[0].pid or 0, signal.SIGKILL)
        refused = client.post("/infer", params={"model": NAME}, files=files)
        assert refused.status_code == 503, refused.text
        assert refused.json()["detail"].startswith("no Triton replica is ready")
        assert first in refused.json()["detail"] and second in refused.json()["detail"]
        assert client.get("/readyz").status_code == 503


def _kill_under_load(client: httpx.Client, files: Files, server: TritonServer) -> None:
    """SIGKILL ``server`` (its python stubs too) while requests keep coming: none fails."""
    failures: list[str] = []
    answered = 0
    stop = threading.Event()

    def hammer() -> None:
        nonlocal answered
        while not stop.is_set():
            answer = client.post("/infer", params={"model": NAME}, files=files)
            if answer.status_code == 200:
                answered += 1
            else:
                failures.append(f"{answer.status_code} {answer.text}")

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        stop.wait(1.0)
        assert server.pid is not None
        os.killpg(server.pid, signal.SIGKILL)
        stop.wait(2.0)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not failures, failures[:3]
    assert answered >= 2


def _publish_is_undone_everywhere(
    client: httpx.Client, settings: Settings, export_id: int, worker: Worker, up: str, down: str
) -> None:
    """A replica that cannot load the new version (it is down) fails the publish: the
    version is taken off the replica that loaded it, version 1 serves there again."""
    again = client.post(f"/models/{NAME}/publish", json={"job_id": export_id})
    failed = wait_for(client, again.json()["id"], {"succeeded", "failed"}, worker=worker)
    assert failed["status"] == "failed", client.get(f"/jobs/{failed['id']}/logs").text
    error = failed["error"]
    assert f"Triton did not load {NAME} version 2 on every replica" in error, error
    assert f"{up}: serves version 2" in error and f"{down}: Triton is not reachable" in error
    assert f"Reloading version 1: {up}: serves version 1" in error, error
    assert existing_versions(settings.model_repository, NAME) == [1]
    assert {triton.served_version(up, m) for m in EnsembleNames(NAME).load_order} == {"1"}
    assert [v["version"] for v in client.get(f"/models/{NAME}").json()] == [1]
