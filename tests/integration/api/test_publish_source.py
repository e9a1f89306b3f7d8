"""Which job a publish may serve is decided at the door by the configured net backend: the
torch backend serves a train or prune job's checkpoint, the others an export's graph (the
real app on Postgres and Redis; no worker runs these jobs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from maskops_api.main import create_app
from maskops_core.db.models import Job, PublishedModel
from maskops_core.settings import Settings

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


def test_the_torch_backend_serves_checkpoints_not_exports(torch_client: TestClient) -> None:
    export = _succeeded(torch_client, "export", {"onnx": "jobs/1/model.onnx"})
    response = torch_client.post("/models/m/publish", json={"job_id": export})
    assert response.status_code == 422, response.text
    assert "serves a train or prune job's checkpoint" in response.json()["detail"]
    for action in ("train", "prune"):
        parent = _succeeded(torch_client, action, {"checkpoint": "jobs/2/model.pth"})
        accepted = torch_client.post(f"/models/m_{action}/publish", json={"job_id": parent})
        assert accepted.status_code == 202, accepted.text


def test_get_model_reports_where_its_network_runs(
    clean_db: Settings, tmp_path: Path, tiny_checkpoint: Path
) -> None:
    from maskops.serving import EnsembleNames, publish
    from maskops_triton.launcher import TritonServer

    repository = tmp_path / "repository"
    publish(tiny_checkpoint, repository, "m", net_backend="torch", max_batch_size=2)
    with TritonServer(repository, models=EnsembleNames("m").load_order) as server:
        settings = clean_db.model_copy(update={"triton_url": server.http_url})
        with TestClient(base_url="http://localhost", app=create_app(settings)) as client:
            train = _succeeded(client, "train", {"checkpoint": "jobs/1/model.pth"})
            factory = client.app.state.session_factory  # type: ignore[attr-defined]
            with factory() as session, session.begin():
                session.add(PublishedModel(name="m", version=1, job_id=train, published=True))
            (version,) = client.get("/models/m").json()
    assert version["network"] == {"net_backend": "torch", "device": "cpu", "precision": "fp32"}
    assert version["replicas"] == {server.http_url: "READY"}
