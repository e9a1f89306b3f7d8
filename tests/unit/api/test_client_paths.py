"""Paths sent over REST stay inside the data root (issue: any readable host file could be
named by a spec or an option): 422 at the door naming the field; the operator's
pretrained-weights folders are the one exception, for ``checkpoint``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.main import create_app
from maskops_core.db.models import Job
from maskops_core.settings import Settings
from tests.unit.api.conftest import SMALL_SPEC, RecordingDispatcher


@pytest.fixture
def pretrained(tmp_path: Path) -> Path:
    folder = tmp_path / "pretrained"
    folder.mkdir()
    (folder / "resnet18.pth").write_bytes(b"weights")
    return folder


@pytest.fixture
def api(settings: Settings, pretrained: Path) -> Iterator[TestClient]:
    configured = settings.model_copy(update={"pretrained_dirs": [pretrained]})
    with TestClient(
        base_url="http://localhost", app=create_app(configured, dispatcher=RecordingDispatcher())
    ) as client:
        yield client


def _spec(**top: Any) -> dict[str, Any]:
    base = cast(dict[str, Any], SMALL_SPEC["data_config"])
    return {**SMALL_SPEC, **top, "data_config": {**base, **top.pop("data_config", {})}}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (_spec(checkpoint="/etc/passwd"), "checkpoint"),
        (_spec(checkpoint="../../../../etc/hostname"), "checkpoint"),
        (_spec(pruned_model_path="/etc/passwd"), "pruned_model_path"),
        (_spec(data_config={"training_file_pattern": "/var/lib/*"}), "training_file_pattern"),
        (_spec(data_config={"val_json_file": "a/../../b.json"}), "val_json_file"),
    ],
)
def test_spec_paths_outside_the_data_root_are_422(
    api: TestClient, spec: dict[str, Any], field: str
) -> None:
    answer = api.post("/experiments", json={"name": "e", "spec": spec})
    assert answer.status_code == 422, answer.text
    assert field in answer.text and "relative to the data root" in answer.text


def test_spec_text_names_the_line_too(api: TestClient) -> None:
    text = 'checkpoint: "/etc/passwd"\ndata_config {\n  num_classes: 4\n}\n'
    answer = api.post("/experiments", json={"name": "e", "spec_text": text})
    assert answer.status_code == 422 and "checkpoint" in answer.text


def test_relative_paths_and_the_pretrained_folder_are_accepted(
    api: TestClient, pretrained: Path
) -> None:
    for spec in (
        _spec(checkpoint="jobs/1/results/model.step-4.pth", pruned_model_path="p/model.pth"),
        _spec(checkpoint=str(pretrained / "resnet18.pth")),
        _spec(data_config={"training_file_pattern": "datasets/1/shards/train-*"}),
    ):
        answer = api.post("/experiments", json={"name": "e", "spec": spec})
        assert answer.status_code == 201, answer.text
    # The pretrained folder is for weights, not for data.
    outside = _spec(data_config={"val_json_file": str(pretrained / "resnet18.pth")})
    assert api.post("/experiments", json={"name": "e", "spec": outside}).status_code == 422


def test_the_update_of_an_experiment_is_held_to_the_same_rule(api: TestClient) -> None:
    created = api.post("/experiments", json={"name": "e", "spec": _spec()}).json()
    answer = api.put(f"/experiments/{created['id']}", json={"spec": _spec(checkpoint="/etc")})
    assert answer.status_code == 422 and "checkpoint" in answer.text


@pytest.mark.parametrize("model_path", ["../../../../../etc/hostname", "/etc/passwd"])
def test_option_paths_outside_the_data_root_are_422(
    api: TestClient, factory: sessionmaker[Session], model_path: str
) -> None:
    with factory() as session, session.begin():
        parent = Job(action="train", status="succeeded", queue="t_gpu", options={})
        session.add(parent)
        session.flush()
        parent_id = parent.id
    body = {"action": "prune", "parent_job_id": parent_id, "options": {"model_path": model_path}}
    answer = api.post("/jobs", json=body)
    assert answer.status_code == 422, answer.text
    assert "options.model_path" in answer.text


def test_checkpoint_names_torchvision_weights_but_no_url(api: TestClient) -> None:
    spec = _spec(checkpoint="MaskRCNN_ResNet50_FPN_Weights.COCO_V1")
    created = api.post("/experiments", json={"name": "e", "spec": spec})
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["checkpoint"] == "MaskRCNN_ResNet50_FPN_Weights.COCO_V1"
    url = "http://127.0.0.1:9/w.pth#sha256=" + "0" * 64
    answer = api.post("/experiments", json={"name": "e", "spec": _spec(checkpoint=url)})
    assert answer.status_code == 422 and "fetches no URL" in answer.text, answer.text
