"""Datasets, experiments and jobs over HTTP: validation, versions, idempotency, paging."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from maskops_core.db.models import Dataset, Job
from tests.support.experiment_versions import check_trial_versions_are_never_the_default
from tests.unit.api.conftest import DATASET_BODY, SMALL_SPEC, RecordingDispatcher


def _converted_dataset(client: TestClient, factory: sessionmaker[Session]) -> int:
    dataset_id = client.post("/datasets", json=DATASET_BODY).json()["id"]
    with factory() as s, s.begin():
        s.execute(update(Dataset).where(Dataset.id == dataset_id).values(shards_dir="x"))
    return int(dataset_id)


def test_register_dataset_queues_conversion(
    client: TestClient, dispatcher: RecordingDispatcher
) -> None:
    response = client.post("/datasets", json=DATASET_BODY)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["status"] == "queued"
    assert set(body["splits"]) == {"train", "val"}
    job = client.get(f"/jobs/{body['convert_job_id']}").json()
    assert (job["action"], job["queue"], job["dataset_id"]) == (
        "dataset_convert",
        "t_cpu",
        body["id"],
    )
    assert dispatcher.sent == [
        ("dataset_convert", job["id"], "t_cpu", f"maskops-job-{job['id']}-1")
    ]


@pytest.mark.parametrize(
    ("image_dir", "status", "message"),
    [
        ("/etc", 422, "relative to the data root"),
        ("shapes/../../etc", 422, "without '..'"),
        # Well formed, naming nothing: not found, as an id of no row.
        ("shapes/images/nope", 404, "is not a directory"),
    ],
)
def test_dataset_paths_are_confined_to_the_data_root(
    client: TestClient, image_dir: str, status: int, message: str
) -> None:
    body = {**DATASET_BODY, "train": {**DATASET_BODY["train"], "image_dir": image_dir}}  # type: ignore[dict-item]
    response = client.post("/datasets", json=body)
    assert response.status_code == status
    assert message in response.json()["detail"]
    assert "train" in response.json()["detail"]


def test_dataset_symlink_out_of_the_root_is_rejected(client: TestClient, settings) -> None:
    (settings.data_root / "escape").symlink_to("/etc")
    body = {
        **DATASET_BODY,
        "train": {"image_dir": "escape", "annotation_file": "shapes/annotations/train.json"},
    }
    response = client.post("/datasets", json=body)
    assert response.status_code == 422
    assert "leaves the data root" in response.json()["detail"]


def test_experiment_from_json_and_text_with_versions(client: TestClient) -> None:
    created = client.post("/experiments", json={"name": "e", "spec": SMALL_SPEC})
    assert created.status_code == 201, created.text
    exp = created.json()
    assert exp["version"] == 1 and exp["spec"]["maskrcnn_config"]["nlayers"] == 10
    text = client.get(f"/experiments/{exp['id']}/spec.txt")
    assert text.status_code == 200 and "nlayers: 10" in text.text
    updated = client.put(
        f"/experiments/{exp['id']}",
        json={"spec_text": text.text.replace("nlayers: 10", "nlayers: 18")},
    )
    assert updated.status_code == 200, updated.text
    assert updated.json()["version"] == 2
    assert updated.json()["spec"]["maskrcnn_config"]["nlayers"] == 18
    old = client.get(f"/experiments/{exp['id']}", params={"version": 1}).json()
    assert old["spec"]["maskrcnn_config"]["nlayers"] == 10 and old["latest_version"] == 2


def test_search_trial_versions_never_become_the_default_version(
    client: TestClient, factory: sessionmaker[Session]
) -> None:
    dataset_id = _converted_dataset(client, factory)
    exp = client.post(
        "/experiments", json={"name": "e", "dataset_id": dataset_id, "spec": SMALL_SPEC}
    ).json()
    check_trial_versions_are_never_the_default(client, factory, exp["id"])


def test_bad_specs_are_422_with_field_and_line(client: TestClient) -> None:
    bad_json = client.post(
        "/experiments", json={"name": "e", "spec": {"maskrcnn_config": {"nlayers": 42}}}
    )
    assert bad_json.status_code == 422
    assert "maskrcnn_config.nlayers" in bad_json.json()["detail"]
    bad_text = client.post(
        "/experiments",
        json={"name": "e", "spec_text": "seed: 1\nmaskrcnn_config {\n  nlayers: 42\n}\n"},
    )
    assert bad_text.status_code == 422
    detail = bad_text.json()["detail"]
    assert "nlayers" in detail and ":3:" in detail
    both = client.post("/experiments", json={"name": "e", "spec": {}, "spec_text": ""})
    assert both.status_code == 422 and "exactly one" in both.json()["detail"]


def test_job_validation_errors_are_4xx(client: TestClient, factory) -> None:
    assert client.post("/jobs", json={"action": "train"}).status_code == 422
    assert client.post("/jobs", json={"action": "train", "experiment_id": 99}).status_code == 404
    assert client.post("/jobs", json={"action": "fly"}).status_code == 422
    dataset_id = client.post("/datasets", json=DATASET_BODY).json()["id"]
    exp = client.post(
        "/experiments", json={"name": "e", "dataset_id": dataset_id, "spec": SMALL_SPEC}
    ).json()
    not_converted = client.post("/jobs", json={"action": "train", "experiment_id": exp["id"]})
    assert not_converted.status_code == 409 and "not converted" in not_converted.json()["detail"]
    no_parent = client.post("/jobs", json={"action": "evaluate", "experiment_id": exp["id"]})
    assert no_parent.status_code == 422 and "parent_job_id" in no_parent.json()["detail"]
    assert client.get("/jobs/12345").status_code == 404
    assert client.get("/jobs", params={"limit": 0}).status_code == 422


def test_idempotency_key_returns_the_same_job(
    client: TestClient, factory, dispatcher: RecordingDispatcher
) -> None:
    dataset_id = _converted_dataset(client, factory)
    exp = client.post(
        "/experiments", json={"name": "e", "dataset_id": dataset_id, "spec": SMALL_SPEC}
    ).json()
    body = {"action": "train", "experiment_id": exp["id"]}
    first = client.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
    again = client.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert [s for s in dispatcher.sent if s[0] == "train"] == [
        ("train", first.json()["id"], "t_gpu", f"maskops-job-{first.json()['id']}-1")
    ]
    other = client.post(
        "/jobs", json={**body, "options": {"x": 1}}, headers={"Idempotency-Key": "k1"}
    )
    assert other.status_code == 409
    third = client.post("/jobs", json=body, headers={"Idempotency-Key": "k2"})
    assert third.json()["id"] != first.json()["id"]


def test_pagination_and_filters(client: TestClient, factory) -> None:
    dataset_id = _converted_dataset(client, factory)
    exp = client.post(
        "/experiments", json={"name": "e", "dataset_id": dataset_id, "spec": SMALL_SPEC}
    ).json()
    ids = [
        client.post("/jobs", json={"action": "train", "experiment_id": exp["id"]}).json()["id"]
        for _ in range(5)
    ]
    page = client.get("/jobs", params={"action": "train", "limit": 2, "offset": 1}).json()
    assert page["total"] == 5
    assert [j["id"] for j in page["items"]] == sorted(ids, reverse=True)[1:3]
    with factory() as s, s.begin():
        s.execute(update(Job).where(Job.id == ids[0]).values(status="failed"))
    failed = client.get("/jobs", params={"status": "failed"}).json()
    assert [j["id"] for j in failed["items"]] == [ids[0]]


def test_cancel_queued_job_and_resume_rules(client: TestClient, factory) -> None:
    dataset_id = _converted_dataset(client, factory)
    exp = client.post(
        "/experiments", json={"name": "e", "dataset_id": dataset_id, "spec": SMALL_SPEC}
    ).json()
    job = client.post("/jobs", json={"action": "train", "experiment_id": exp["id"]}).json()
    cancelled = client.post(f"/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert client.post(f"/jobs/{job['id']}/cancel").status_code == 409
    resumed = client.post(f"/jobs/{job['id']}/resume")
    assert resumed.status_code == 202 and resumed.json()["status"] == "queued"
    assert client.post(f"/jobs/{job['id']}/resume").status_code == 409
    convert_job = client.get("/datasets/1").json()["convert_job_id"]
    assert client.post(f"/jobs/{convert_job}/resume").status_code == 409


def test_broker_down_still_accepts_the_job(
    client: TestClient, factory, dispatcher: RecordingDispatcher
) -> None:
    dispatcher.fail = True
    response = client.post("/datasets", json=DATASET_BODY)
    assert response.status_code == 201
    job = client.get(f"/jobs/{response.json()['convert_job_id']}").json()
    assert job["status"] == "queued"
    with factory() as s:
        assert s.get(Job, job["id"]).dispatched_at is None


def test_experiment_creation_is_idempotent(client: TestClient) -> None:
    body = {"name": "e", "spec": SMALL_SPEC}
    first = client.post("/experiments", json=body, headers={"Idempotency-Key": "x"})
    again = client.post("/experiments", json=body, headers={"Idempotency-Key": "x"})
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert client.get("/experiments").json()["total"] == 1


def test_an_idempotency_key_is_scoped_to_its_route(
    client: TestClient, factory: sessionmaker[Session]
) -> None:
    """The publish route and POST /jobs both create jobs: one key on each is two requests."""
    with factory() as s, s.begin():
        export = Job(action="export", status="succeeded", queue="t_gpu", options={})
        s.add(export)
        s.flush()
        export_id = export.id
    headers = {"Idempotency-Key": "k-1"}
    published = client.post("/models/m/publish", json={"job_id": export_id}, headers=headers)
    assert published.status_code == 202, published.text
    again = client.post("/models/m/publish", json={"job_id": export_id}, headers=headers)
    assert again.json()["id"] == published.json()["id"]
    dataset_id = client.post("/datasets", json=DATASET_BODY).json()["id"]
    body = {"action": "dataset_convert", "dataset_id": dataset_id}
    converted = client.post("/jobs", json=body, headers=headers)
    assert converted.status_code == 202, converted.text
    assert converted.json()["id"] != published.json()["id"]
    assert converted.json()["action"] == "dataset_convert"
