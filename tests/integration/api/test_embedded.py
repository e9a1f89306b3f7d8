"""``maskops serve``: the embedded stack (SQLite, Celery's SQLAlchemy broker, a real worker
process) starts, registers and converts the demo dataset, and stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from maskops_serve.demo import DEMO_IMAGES

pytestmark = pytest.mark.integration

MASKOPS = Path(sys.executable).with_name("maskops")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_runs_the_stack_and_stops_cleanly(tmp_path: Path) -> None:
    port = _free_port()
    out = tmp_path / "serve.out"
    with out.open("wb") as handle:
        process = subprocess.Popen(
            [str(MASKOPS), "serve", "--port", str(port), "--state-dir", str(tmp_path / "state"),
             "--no-redis", "--no-triton"],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        dataset = None
        while time.monotonic() < deadline:
            try:
                datasets = httpx.get(f"{base}/datasets", timeout=5).json()["items"]
            except httpx.HTTPError:
                datasets = []
            if datasets:
                dataset = datasets[0]
                if dataset["status"] in ("succeeded", "failed"):
                    break
            assert process.poll() is None, out.read_text()
            time.sleep(1)
        assert dataset is not None and dataset["status"] == "succeeded", out.read_text()
        counts = dataset["counts"]
        assert counts["train"]["images"] + counts["val"]["images"] == DEMO_IMAGES
        assert httpx.get(f"{base}/readyz", timeout=10).json()["checks"]["broker"] == "ok"
        text = out.read_text()
        assert f"Swagger UI: {base}/docs" in text and "sqla+sqlite" in text
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(90)
    text = out.read_text()
    assert code == 0, text
    assert "stopping: worker" in text
    worker_pid = int(text.split("worker:   pid ")[1].split()[0])
    alive = subprocess.run(["kill", "-0", str(worker_pid)], capture_output=True)
    assert alive.returncode != 0, "the worker outlived maskops serve"
