"""Which job a publish may serve is decided at the door by the configured net backend: the
torch backend serves a train or prune job's checkpoint, the others an export's graph (the
real app on Postgres and Redis; no worker runs these jobs)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from maskops.export.parity import compare_detections
from maskops_api.main import create_app
from maskops_core.db.models import Job, PublishedModel
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker, wait_for

pytestmark = pytest.mark.integration


def _succeeded(client: TestClient, action: str, result: dict[str, str]) -> int:
    factory = client.app.state.session_factory  # type: ignore[attr-defined]
    with factory() as session:
        job = Job(queue="cpu", action=action, status="succeeded", result=result)
        session.add(job)
        session.commit()
        return int(job.id)


@pytest.fixture
def torch_client(clean_db: Settings) -> Iterator[TestClient]:
    settings = clean_db.model_copy(update={"triton_net_backend": "torch"})
    with TestClient(base_url="http://localhost", app=create_app(settings)) as test_client:
        yield test_client


def test_a_checkpoint_needs_the_torch_backend(client: TestClient) -> None:
    train = _succeeded(client, "train", {"checkpoint": "jobs/1/model.pth"})
    response = client.post("/models/m/publish", json={"job_id": train})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "MASKOPS_TRITON_NET_BACKEND=torch" in detail and "publishes with python" in detail
    export = _succeeded(client, "export", {"onnx": "jobs/2/model.onnx"})
    assert client.post("/models/m/publish", json={"job_id": export}).status_code == 202


def test_the_torch_backend_serves_checkpoints_and_exports(torch_client: TestClient) -> None:
    """An export's publish serves the checkpoint it was made from (the export job's result
    names it), so the same publish works whichever backend the server runs."""
    export = _succeeded(
        torch_client,
        "export",
        {"onnx": "jobs/1/model.onnx", "source_checkpoint": "jobs/0/model.pth"},
    )
    assert torch_client.post("/models/m/publish", json={"job_id": export}).status_code == 202
    for action in ("train", "prune"):
        parent = _succeeded(torch_client, action, {"checkpoint": "jobs/2/model.pth"})
        accepted = torch_client.post(f"/models/m_{action}/publish", json={"job_id": parent})
        assert accepted.status_code == 202, accepted.text


def test_get_model_reports_where_its_network_runs(
    clean_db: Settings, tmp_path: Path, tiny_checkpoint: Path
) -> None:
    from maskops.serving import EnsembleNames, publish
    from maskops.serving.launcher import TritonServer

    repository = tmp_path / "repository"
    publish(
        tiny_checkpoint,
        repository,
        "m",
        net_backend="torch",
        max_batch_size=2,
        instances=2,
        processing_instances=3,
    )
    with TritonServer(repository, models=EnsembleNames("m").load_order) as server:
        settings = clean_db.model_copy(update={"triton_url": server.http_url})
        with TestClient(base_url="http://localhost", app=create_app(settings)) as client:
            train = _succeeded(client, "train", {"checkpoint": "jobs/1/model.pth"})
            factory = client.app.state.session_factory  # type: ignore[attr-defined]
            with factory() as session, session.begin():
                session.add(PublishedModel(name="m", version=1, job_id=train, published=True))
            (version,) = client.get("/models/m").json()
    assert version["network"] == {"net_backend": "torch", "device": "cpu", "precision": "fp32"}
    assert version["instances"] == {"preprocess": 3, "network": 2, "postprocess": 3}
    assert version["replicas"] == {server.http_url: "READY"}


def test_a_train_job_published_on_torch_answers_infer_as_in_process(
    clean_db: Settings,
    tmp_path: Path,
    workers: Callable[..., Worker],
    tiny_checkpoint: Path,
    demo_dataset: Any,
) -> None:
    """The whole path on the CPU: the door takes a train job, the worker publishes its
    checkpoint with the torch net backend and Triton loads it, ``POST /infer`` answers
    through the ensemble with the detections of in-process inference on that checkpoint."""
    from maskops.export.parity import coco_results_as_detections as as_detections
    from maskops.serving.launcher import TritonServer
    from tests.integration.triton.test_torch_backend import in_process

    stored = clean_db.data_root / "jobs" / "1" / "model.pth"
    stored.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny_checkpoint, stored)
    repository = tmp_path / "repository"
    repository.mkdir()
    with TritonServer(repository, models=(), log_file=tmp_path / "triton.log") as server:
        settings = clean_db.model_copy(
            update={
                "triton_url": server.http_url,
                "model_repository": repository,
                "triton_net_backend": "torch",
            }
        )
        worker = workers("w1", settings)
        with TestClient(base_url="http://localhost", app=create_app(settings)) as client:
            train = _succeeded(client, "train", {"checkpoint": "jobs/1/model.pth"})
            published = client.post("/models/shapes/publish", json={"job_id": train})
            assert published.status_code == 202, published.text
            job = wait_for(client, published.json()["id"], {"succeeded", "failed"}, worker=worker)
            assert job["status"] == "succeeded", client.get(f"/jobs/{job['id']}/logs").text
            image = sorted(Path(demo_dataset.val_images).glob("*.jpg"))[0]
            answer = client.post(
                "/infer",
                params={"model": "shapes", "score_threshold": 0.05},
                files=[("images", (image.name, image.read_bytes(), "image/jpeg"))],
            )
            assert answer.status_code == 200, answer.text
            (version,) = client.get("/models/shapes").json()
    assert version["network"] == {"net_backend": "torch", "device": "cpu", "precision": "fp32"}
    (reference,) = in_process(tiny_checkpoint, [image.read_bytes()], 0.05)
    assert reference, "the tiny model detected nothing at 0.05"
    report = compare_detections(
        [as_detections(reference)], [as_detections(answer.json())], data_type="fp32"
    )
    assert report.passed, report.summary()
