"""A publish job on a GPU host's settings (``MASKOPS_TRITON_DEVICE=gpu``) with the tensorrt
net backend fails, before anything is written or loaded, when the export has no engine
or one built by another TensorRT than the Triton's: the job's error says which."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from maskops_core.db.models import Job
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker, wait_for
from tests.support.fake_export import fake_engine, fake_onnx_export

pytestmark = pytest.mark.integration


def _export_job(settings: Settings, tmp_path: Path) -> tuple[int, Path]:
    """A succeeded export job whose ONNX is in the data root (a tagged stand-in graph: the
    publish must fail before any Triton would run it)."""
    onnx = fake_onnx_export(tmp_path / "model.fp16.onnx", "batch")
    target = settings.data_root / "exports" / onnx.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(onnx, target)
    engine = make_engine(settings)
    try:
        with make_session_factory(engine)() as session, session.begin():
            job = Job(action="export", status="succeeded", queue="gpu", options={})
            job.result = {"onnx": f"exports/{onnx.name}"}
            session.add(job)
            session.flush()
            return int(job.id), target
    finally:
        engine.dispose()


def test_tensorrt_publish_jobs_fail_naming_the_engine_problem(
    client: TestClient, clean_db: Settings, workers: Callable[..., Worker], tmp_path: Path
) -> None:
    export_id, onnx = _export_job(clean_db, tmp_path)
    repository = tmp_path / "model_repository"
    gpu_host = clean_db.model_copy(
        update={
            "triton_device": "gpu",
            "triton_net_backend": "tensorrt",
            "triton_gpus": [0],
            "model_repository": repository,
            # Nothing listens there: a publish that reached the loading step would say so.
            "triton_url": "127.0.0.1:9",
        }
    )
    worker = workers("w1", gpu_host)

    def publish_error() -> str:
        submitted = client.post("/models/shapes/publish", json={"job_id": export_id})
        assert submitted.status_code == 202, submitted.text
        job = wait_for(client, submitted.json()["id"], {"succeeded", "failed"}, worker=worker)
        assert job["status"] == "failed", job
        assert "did not load" not in job["error"], job["error"]
        return str(job["error"])

    error = publish_error()
    assert error.startswith("publish 'shapes': "), error
    assert "model.fp16.engine: no such TensorRT engine file" in error, error
    fake_engine(onnx, tensorrt_version="10.8.0.1")
    error = publish_error()
    assert "built by TensorRT 10.8.0.1 but Triton runs TensorRT 10.7.0.23" in error, error
    assert "MASKOPS_TRITON_TENSORRT_VERSION" in error
    assert not repository.exists()
    assert client.get("/models/shapes").status_code == 404
