"""Tracker destinations are the operator's: a spec sent over REST that names where a
tracker writes (an MLflow tracking URI: a cloud metadata endpoint, a local port, a
``file:`` directory anywhere; a W&B directory) is refused at the door with a 422 naming
the field, and so is a tracker the operator does not allow. The worker drops such fields
from specs stored earlier and keeps local tracker stores under the job's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from maskops.spec.models import ExperimentSpec
from maskops.training.trackers import mlflow_tracking_uri
from maskops_api.main import create_app
from maskops_core.settings import Settings
from maskops_worker.actions import confine_trackers
from maskops_worker.contract import JobInputError
from tests.unit.api.conftest import SMALL_SPEC, RecordingDispatcher


def _create(client: TestClient, **blocks: Any) -> tuple[int, str]:
    response = client.post("/experiments", json={"name": "e", "spec": {**SMALL_SPEC, **blocks}})
    return response.status_code, response.json().get("detail", "")


@pytest.mark.parametrize(
    "uri",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.1:6379/",
        "file:/etc/maskops-owned",
        "sqlite:////tmp/anywhere.db",
        "/var/tmp/mlruns",
        "mlruns",
    ],
)
def test_a_tracking_uri_is_refused_at_the_door(client: TestClient, uri: str) -> None:
    code, detail = _create(client, mlflow_config={"tracking_uri": uri})
    assert code == 422 and "mlflow_config.tracking_uri" in detail, detail
    assert "set by the operator" in detail


def test_a_wandb_dir_and_disallowed_trackers_are_refused(client: TestClient) -> None:
    code, detail = _create(client, wandb_config={"enabled": True, "wandb_dir": "/root"})
    assert code == 422 and "wandb_config" in detail and "does not allow" in detail, detail
    code, detail = _create(client, clearml_config={"project": "p"})
    assert code == 422 and "clearml_config" in detail and "allowed: mlflow" in detail, detail
    # Off (TAO's default) or naming only names: accepted.
    code, detail = _create(client, wandb_config={"enabled": False, "project": "p"})
    assert code == 201, detail
    code, detail = _create(client, mlflow_config={"experiment_name": "x", "run_name": "r"})
    assert code == 201, detail


def test_a_tao_text_spec_names_the_field_and_line(client: TestClient) -> None:
    text = 'total_steps: 4\nmlflow_config {\n  tracking_uri: "http://169.254.169.254/"\n}\n'
    response = client.post("/experiments", json={"name": "t", "spec_text": text})
    assert response.status_code == 422
    assert "mlflow_config.tracking_uri" in response.json()["detail"]


def test_the_worker_keeps_tracker_stores_under_the_job(tmp_path: Path) -> None:
    """A spec stored before the door refused destinations."""
    job_dir = tmp_path / "jobs" / "7"
    spec = ExperimentSpec.model_validate(
        {
            **SMALL_SPEC,
            "mlflow_config": {"tracking_uri": "http://169.254.169.254/", "run_name": "r"},
            "wandb_config": {"enabled": True, "mode": "OFFLINE", "wandb_dir": "/etc"},
        }
    )
    confined = confine_trackers(spec, job_dir, allowed=["mlflow", "wandb"])
    assert confined.mlflow_config is not None and confined.wandb_config is not None
    assert confined.mlflow_config.tracking_uri == "" and confined.mlflow_config.run_name == "r"
    assert confined.wandb_config.wandb_dir == str(job_dir / "wandb")
    assert (job_dir / "wandb").is_dir()
    uri = mlflow_tracking_uri(confined.mlflow_config, job_dir / "results")
    assert uri == (job_dir / "results" / "mlruns").absolute().as_uri()
    with pytest.raises(JobInputError, match="wandb_config"):
        confine_trackers(spec, job_dir, allowed=["mlflow"])


def test_a_wandb_dir_is_refused_where_wandb_is_allowed(settings: Settings) -> None:
    allowing = settings.model_copy(update={"trackers": ["mlflow", "wandb"]})
    app = create_app(allowing, dispatcher=RecordingDispatcher())
    with TestClient(base_url="http://localhost", app=app) as client:
        code, detail = _create(client, wandb_config={"enabled": True, "wandb_dir": "/root"})
        assert code == 422 and "wandb_config.wandb_dir" in detail, detail
        code, detail = _create(client, wandb_config={"enabled": True, "project": "p"})
        assert code == 201, detail
