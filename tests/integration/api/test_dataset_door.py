"""Requests that are themselves bad are a 4xx naming the member, file or field, never a
500, against the real app on Postgres and Redis (no worker: nothing here reaches one)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from maskops_core.settings import Settings
from tests.integration.api.test_door_checks import SPEC, tiny_dataset

pytestmark = pytest.mark.integration


def test_automl_options_are_bounded_in_size_as_job_options_are(
    client: TestClient, clean_db: Settings
) -> None:
    dataset = tiny_dataset(client, clean_db)
    experiment = client.post(
        "/experiments", json={"name": "e", "dataset_id": dataset["id"], "spec": SPEC}
    ).json()
    options = {"algorithm": "random", "note": "x" * (64 * 1024)}
    response = client.post("/automl", json={"experiment_id": experiment["id"], "options": options})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("options: ") and "at most 65536 bytes as JSON" in detail, detail
    assert client.get("/jobs").json()["total"] == 1  # the dataset's conversion only
