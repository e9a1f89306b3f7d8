"""Smaller defects found by probing a running server: each answered as documented."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.cli_tokens import TokenCommandError, run_token_command
from maskops_core.db.models import ApiToken, Dataset, Job, utcnow
from maskops_core.settings import Settings
from tests.unit.api.conftest import DATASET_BODY, SMALL_SPEC


def test_a_nul_byte_in_an_artifact_path_is_404(
    client: TestClient, factory: sessionmaker[Session], settings: Settings
) -> None:
    with factory() as session:
        job = Job(action="export", status="succeeded", queue="gpu")
        session.add(job)
        session.commit()
        job_id = job.id
    (settings.jobs_dir / str(job_id)).mkdir(parents=True)
    (settings.jobs_dir / str(job_id) / "model.onnx").write_bytes(b"onnx")
    assert client.get(f"/jobs/{job_id}/artifacts/model.onnx").content == b"onnx"
    for path in ("model.onnx%00.txt", "%00", "a/%00/b"):
        response = client.get(f"/jobs/{job_id}/artifacts/{path}")
        assert response.status_code == 404, (path, response.text)
        assert "has no artifact" in response.json()["detail"]


def test_token_list_shows_expired_tokens_as_expired(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    url = settings.database_url
    for name in ("live", "old", "gone"):
        list(run_token_command("create", database_url=url, name=name, scope="read"))
    with factory() as session:
        old = session.query(ApiToken).filter_by(name="old").one()
        old.expires_at = utcnow() - timedelta(minutes=1)
        session.commit()
    list(run_token_command("revoke", database_url=url, token_id=3))
    rows = [line.split("\t") for line in run_token_command("list", database_url=url)]
    assert [(r[1], r[3]) for r in rows] == [
        ("live", "active"),
        ("old", "expired"),
        ("gone", "revoked"),
    ]


def test_a_token_name_with_a_bidi_control_is_refused(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    with pytest.raises(TokenCommandError, match=r"^--name: .*\(U\+202E "):
        list(run_token_command("create", database_url=settings.database_url, name="ci\u202ebot"))
    with factory() as session:
        assert session.query(ApiToken).count() == 0


def test_serve_gives_its_worker_every_setting(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lists too (trackers, allowed hosts, pretrained folders), as JSON."""
    from maskops_serve.embedded import settings_environment

    given = settings.model_copy(
        update={
            "trackers": ["mlflow", "wandb"],
            "allowed_hosts": ["api.example"],
            "pretrained_dirs": [tmp_path],
        }
    )
    for key in [k for k in os.environ if k.startswith("MASKOPS_")]:
        monkeypatch.delenv(key)
    for key, value in settings_environment(given).items():
        if key.startswith("MASKOPS_"):
            monkeypatch.setenv(key, value)
    read = Settings(_env_file=None)  # type: ignore[call-arg]
    assert read.model_dump() == given.model_dump()


def test_a_parent_of_another_kind_is_named_with_its_article(
    client: TestClient, factory: sessionmaker[Session]
) -> None:
    dataset_id = client.post("/datasets", json=DATASET_BODY).json()["id"]
    with factory() as session, session.begin():
        session.execute(update(Dataset).where(Dataset.id == dataset_id).values(shards_dir="x"))
    experiment = client.post(
        "/experiments", json={"name": "e", "dataset_id": dataset_id, "spec": SMALL_SPEC}
    ).json()
    with factory() as session:
        evaluate = Job(action="evaluate", status="succeeded", queue="gpu")
        session.add(evaluate)
        session.commit()
        evaluate_id = evaluate.id
    body = {"action": "export", "experiment_id": experiment["id"], "parent_job_id": evaluate_id}
    response = client.post("/jobs", json=body)
    assert response.status_code == 409, response.text
    assert f"cannot use an evaluate job's output (job {evaluate_id})" in response.text
    resumed = client.post(f"/jobs/{evaluate_id}/resume")
    assert f"job {evaluate_id} is an evaluate job; only train" in resumed.json()["detail"]
