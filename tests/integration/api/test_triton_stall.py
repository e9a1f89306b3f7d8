"""A Triton that stalls (SIGSTOP: it still accepts connections, answers nothing) behind the
real API process: ``/infer`` answers 503 within ``MASKOPS_INFER_TIMEOUT_S`` per image, then
at once while the replica's circuit is open, and again reaches Triton once it is back;
concurrent ``/infer`` calls beyond ``MASKOPS_MAX_CONCURRENT_INFER`` are answered 429 at once
and never hold up another route. Loopback only; the real ``tritonserver``."""

from __future__ import annotations

import io
import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from PIL import Image

from maskops_core.db.models import Job, PublishedModel
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.integration.api.conftest import ApiProcess

if TYPE_CHECKING:
    from maskops.serving.launcher import TritonServer

pytestmark = pytest.mark.integration
pytest.importorskip("pytriton")

NAME = "stalled"
TIMEOUT_S = 3.0
"""``MASKOPS_INFER_TIMEOUT_S`` here: one image's request waits at most this."""
LANE = 4
"""``MASKOPS_MAX_CONCURRENT_INFER`` here."""
CALLS = 45


def _publish(settings: Settings) -> None:
    """A published model row: ``/infer`` asks Triton about it (Triton has none loaded)."""
    engine = make_engine(settings)
    try:
        with make_session_factory(engine)() as session, session.begin():
            job = Job(action="export", status="succeeded", queue="gpu", options={})
            session.add(job)
            session.flush()
            session.add(PublishedModel(name=NAME, version=1, job_id=job.id))
    finally:
        engine.dispose()


@pytest.fixture
def stack(clean_db: Settings, tmp_path: Path) -> Iterator[tuple[httpx.Client, TritonServer]]:
    """The API process (this interpreter's packages) in front of one real Triton."""
    from maskops.serving.launcher import TritonServer

    _publish(clean_db)
    repository = tmp_path / "model_repository"
    repository.mkdir()
    with TritonServer(repository, models=(), log_file=tmp_path / "triton.log") as server:
        served = clean_db.model_copy(
            update={"triton_url": server.http_url, "model_repository": repository}
        )
        env = {"MASKOPS_INFER_TIMEOUT_S": str(TIMEOUT_S), "MASKOPS_MAX_CONCURRENT_INFER": str(LANE)}
        api = ApiProcess(Path(sys.executable), served, tmp_path, env)
        try:
            client = api.start()
            yield client, server
            client.close()
        finally:
            api.stop()
            assert server.pid is not None
            os.kill(server.pid, signal.SIGCONT)  # stop() must be able to stop it


def _infer(client: httpx.Client) -> tuple[httpx.Response, float]:
    image = io.BytesIO()
    Image.new("RGB", (16, 16)).save(image, "PNG")
    started = time.monotonic()
    response = client.post(
        "/infer",
        params={"model": NAME},
        files=[("images", ("x.png", image.getvalue()))],
        timeout=TIMEOUT_S + 20,
    )
    return response, time.monotonic() - started


def _timed_get(client: httpx.Client, path: str) -> tuple[int, float]:
    started = time.monotonic()
    return client.get(path).status_code, time.monotonic() - started


def test_a_stalled_triton_costs_bounded_time_and_starves_no_route(
    stack: tuple[httpx.Client, TritonServer],
) -> None:
    client, server = stack
    answer, _ = _infer(client)  # Triton answers: the model is not loaded there
    assert answer.status_code == 503 and "not loaded in Triton" in answer.json()["detail"]
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)

    with ThreadPoolExecutor(max_workers=CALLS + 1) as pool:
        calls = [pool.submit(_infer, client) for _ in range(CALLS)]
        time.sleep(0.5)  # every call sent; those in the lane wait on the stalled Triton
        unrelated = pool.submit(_timed_get, client, "/datasets/1")
        answers = [call.result() for call in calls]
        status, unrelated_s = unrelated.result()
    assert status == 404 and unrelated_s < 1.0, unrelated_s
    stalled = [(r, s) for r, s in answers if r.status_code == 503]
    refused = [(r, s) for r, s in answers if r.status_code == 429]
    assert len(stalled) == LANE and len(refused) == CALLS - LANE, [r.text for r, _ in answers]
    for response, seconds in stalled:
        assert "did not answer within 3 s" in response.json()["detail"], response.text
        assert TIMEOUT_S - 0.5 < seconds < TIMEOUT_S + 2.0, seconds
        assert response.headers["Retry-After"] == "5"
    for response, seconds in refused:
        assert "MASKOPS_MAX_CONCURRENT_INFER" in response.json()["detail"]
        assert response.headers["Retry-After"] == "1" and seconds < 2.0, seconds

    # The replica's circuit is open: refused at once, saying why and when to retry.
    answer, seconds = _infer(client)
    assert answer.status_code == 503 and seconds < 0.5, (answer.text, seconds)
    assert "did not answer within 3 s (circuit open" in answer.json()["detail"]
    assert 1 <= int(answer.headers["Retry-After"]) <= 5

    # Back: after the open time a health probe closes the circuit and Triton is asked.
    os.kill(server.pid, signal.SIGCONT)
    deadline = time.monotonic() + 15
    while "not loaded in Triton" not in answer.text and time.monotonic() < deadline:
        time.sleep(0.5)
        answer, _ = _infer(client)
    assert answer.status_code == 503 and "not loaded in Triton" in answer.json()["detail"]
