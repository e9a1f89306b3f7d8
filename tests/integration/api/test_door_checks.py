"""Bad input refused at the door with a 4xx naming what is wrong, against the real app on
Postgres and Redis (no worker: these jobs must never reach one)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from maskops_core.settings import Settings

pytestmark = pytest.mark.integration

COCO = {"images": [], "annotations": [], "categories": []}


def tiny_dataset(client: TestClient, settings: Settings) -> dict[str, object]:
    """A registered dataset (its dataset_convert job is queued, never run)."""
    root = settings.data_root / "tiny"
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "train.json").write_text(json.dumps(COCO))
    response = client.post(
        "/datasets",
        json={
            "name": "tiny",
            "train": {"image_dir": "tiny/images", "annotation_file": "tiny/train.json"},
        },
    )
    assert response.status_code == 201, response.text
    body: dict[str, object] = response.json()
    return body


def test_log_offsets_past_the_end_read_nothing(client: TestClient, clean_db: Settings) -> None:
    job_id = tiny_dataset(client, clean_db)["convert_job_id"]
    log = clean_db.jobs_dir / str(job_id) / "job.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("line one\nline two\n")
    assert client.get(f"/jobs/{job_id}/logs", params={"offset": 9}).text == "line two\n"
    for offset in (18, 10**6, 2**40):
        response = client.get(f"/jobs/{job_id}/logs", params={"offset": offset})
        assert response.status_code == 200 and response.text == "", (offset, response.text)
    # 2**44 made the seek fail (EINVAL, a 500); the route declares its real maximum.
    response = client.get(f"/jobs/{job_id}/logs", params={"offset": 2**44})
    assert response.status_code == 422 and "offset" in response.json()["detail"]


def test_job_options_are_bounded_in_size(client: TestClient, clean_db: Settings) -> None:
    dataset = tiny_dataset(client, clean_db)
    huge = {"action": "dataset_convert", "dataset_id": dataset["id"], "options": {}}
    huge["options"] = {"note": "x" * (64 * 1024)}
    response = client.post("/jobs", json=huge)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("options: ")
    listed = client.get("/jobs", params={"limit": 5})
    assert len(listed.content) < 10_000 and listed.json()["total"] == 1
