"""``maskops serve``: the embedded stack (SQLite, Celery's SQLAlchemy broker, a real worker
process) starts, registers and converts the demo dataset, runs an AutoML search (its
controller and its trials in the one worker's two slots, the study in SQLite), and stops
cleanly on SIGTERM. The tests share one stack and run in order: the last one stops it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from maskops_serve.demo import DEMO_IMAGES
from tests.integration.api.test_workflow import create_experiment

pytestmark = pytest.mark.integration

MASKOPS = Path(sys.executable).with_name("maskops")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """A running ``maskops serve``, its output file, and its demo dataset once converted."""

    process: subprocess.Popen[bytes]
    out: Path
    client: httpx.Client
    dataset: dict[str, Any]

    def output(self) -> str:
        return self.out.read_text()


def _converted_demo_dataset(served: Served) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    dataset: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            datasets = served.client.get("/datasets").json()["items"]
        except httpx.HTTPError:
            datasets = []
        if datasets:
            dataset = datasets[0]
            if dataset["status"] in ("succeeded", "failed"):
                break
        assert served.process.poll() is None, served.output()
        time.sleep(1)
    assert dataset.get("status") == "succeeded", served.output()
    return dataset


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``maskops serve`` without Redis nor Triton, its demo dataset converted."""
    root = tmp_path_factory.mktemp("serve")
    port = _free_port()
    out = root / "serve.out"
    with out.open("wb") as handle:
        process = subprocess.Popen(
            [str(MASKOPS), "serve", "--port", str(port), "--state-dir", str(root / "state"),
             "--no-redis", "--no-triton"],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    stack = Served(process, out, client, {})
    try:
        stack.dataset = _converted_demo_dataset(stack)
        yield stack
    finally:
        client.close()
        if process.poll() is None:  # a test failed before the last one stopped it
            process.send_signal(signal.SIGTERM)
            process.wait(90)


def test_serve_runs_the_stack(served: Served) -> None:
    counts = served.dataset["counts"]
    assert counts["train"]["images"] + counts["val"]["images"] == DEMO_IMAGES
    assert served.client.get("/readyz").json()["checks"]["broker"] == "ok"
    base = str(served.client.base_url).rstrip("/")
    text = served.output()
    assert f"Swagger UI: {base}/docs" in text and "sqla+sqlite" in text


def test_a_search_runs_on_the_embedded_stack(served: Served) -> None:
    """The controller holds one of the worker's two slots for the whole search; the trials
    train in the other, one after the other, each reporting its evaluation at step 1 to
    the study's pruner in the same SQLite database the controller polls."""
    client = served.client
    experiment_id = create_experiment(client, served.dataset["id"], steps=2, every=1)
    options = {
        "algorithm": "bayesian",
        "max_recommendations": 2,
        "max_concurrent": 2,
        "metric": "val/Total loss",  # apart from trial to trial, even after 2 steps
        "seed": 0,
    }
    response = client.post("/automl", json={"experiment_id": experiment_id, "options": options})
    assert response.status_code == 202, response.text
    job_id = response.json()["job"]["id"]
    deadline = time.monotonic() + 180
    while (job := client.get(f"/jobs/{job_id}").json())["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, client.get(f"/jobs/{job_id}/logs").text
        assert served.process.poll() is None, served.output()
        time.sleep(1)
    assert job["status"] == "succeeded", client.get(f"/jobs/{job_id}/logs").text

    search = client.get(f"/automl/{job_id}").json()
    assert (search["algorithm"], search["sampler"], search["pruner"]) == (
        "bayesian",
        "gp",
        "median",
    )
    trials = search["trials"]
    assert [t["number"] for t in trials] == [0, 1], trials
    assert all(t["state"] in ("complete", "pruned") for t in trials), trials
    assert all(t["job_status"] == "succeeded" for t in trials), trials
    # The first trial cannot be pruned (the median of no finished trial).
    assert trials[0]["state"] == "complete" and "1" in trials[0]["intermediate"], trials
    best = search["best"]
    complete = [t for t in trials if t["state"] == "complete"]
    assert best == min(complete, key=lambda t: t["value"]), search
    assert job["result"]["best"]["job_id"] == best["job_id"]
    assert search["best_checkpoint"].endswith(".pth"), search
    child = client.get(f"/jobs/{best['job_id']}").json()
    assert child["result"]["checkpoint"] == search["best_checkpoint"]


def _wait_for(served: Served, job_id: int, done: tuple[str, ...], deadline: float) -> str:
    client = served.client
    while (status := client.get(f"/jobs/{job_id}").json()["status"]) not in done:
        assert time.monotonic() < deadline, client.get("/readyz").text + served.output()
        assert served.process.poll() is None, served.output()
        time.sleep(0.5)
    return str(status)


def test_two_searches_at_once_both_finish(served: Served) -> None:
    """Two controllers once took both of the worker's slots and waited for ever on trials
    nothing could run. A second search sent while the first one's trial trains took the
    slot that trial freed, before the first search could send its next trial; it now
    waits, unsent, until the first search ends."""
    client = served.client
    experiment_id = create_experiment(client, served.dataset["id"], steps=1, every=0)
    first = {"algorithm": "random", "max_recommendations": 2, "max_concurrent": 1, "seed": 0}
    second = {**first, "max_recommendations": 1}
    job_ids = []
    deadline = time.monotonic() + 300
    for options in (first, second):
        body = {"experiment_id": experiment_id, "options": options}
        response = client.post("/automl", json=body)
        assert response.status_code == 202, response.text
        job_ids.append(response.json()["job"]["id"])
        if len(job_ids) == 1:  # the first search's first trial trains
            while not (trials := client.get(f"/automl/{job_ids[0]}").json()["trials"]) or (
                trials[0]["job_id"] is None
            ):
                assert time.monotonic() < deadline, served.output()
                time.sleep(0.5)
            _wait_for(served, trials[0]["job_id"], ("running", "succeeded"), deadline)
    for job_id in job_ids:
        status = _wait_for(served, job_id, ("succeeded", "failed"), deadline)
        assert status == "succeeded", client.get(f"/jobs/{job_id}/logs").text
    assert client.get("/readyz").json()["checks"]["worker"] == "ok"


def test_serve_stops_cleanly(served: Served) -> None:
    served.process.send_signal(signal.SIGTERM)
    code = served.process.wait(90)
    text = served.output()
    assert code == 0, text
    assert "stopping: worker" in text
    worker_pid = int(text.split("worker:   pid ")[1].split()[0])
    alive = subprocess.run(["kill", "-0", str(worker_pid)], capture_output=True)
    assert alive.returncode != 0, "the worker outlived maskops serve"
