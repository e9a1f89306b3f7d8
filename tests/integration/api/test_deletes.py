"""``DELETE`` of datasets, experiments, jobs and models against real Postgres: rows and
files go together, dependants are named in a 409 that removes nothing, unfinished jobs
and published models are refused, and no API process keeps serving a deleted job."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.cache.job_cache import JobCache
from maskops_api.main import create_app
from maskops_api.services.tokens import create_token
from maskops_core.db.models import (
    Dataset,
    Experiment,
    ExperimentVersion,
    IdempotencyKey,
    Job,
    JobMetric,
    JobStatus,
    PublishedModel,
    TokenScope,
)
from maskops_core.settings import Settings

pytestmark = pytest.mark.integration

PARTS = ("_{}.preprocess", "_{}.net", "_{}.postprocess")


@pytest.fixture
def settings(clean_db: Settings, tmp_path: Path) -> Settings:
    return clean_db.model_copy(update={"model_repository": tmp_path / "model_repository"})


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(base_url="http://localhost", app=create_app(settings)) as test_client:
        assert cache_of(test_client).wait_live(10), "the notification listener did not connect"
        yield test_client


def cache_of(client: TestClient) -> JobCache:
    cache: JobCache = client.app.state.job_cache  # type: ignore[attr-defined]
    return cache


def db(client: TestClient) -> Session:
    factory: sessionmaker[Session] = client.app.state.session_factory  # type: ignore[attr-defined]
    return factory()


def add(client: TestClient, row: Any) -> int:
    with db(client) as session:
        session.add(row)
        session.commit()
        return int(getattr(row, "id", 0))


def add_job(client: TestClient, status: JobStatus = JobStatus.succeeded, **fields: Any) -> int:
    fields.setdefault("action", "train")
    return add(client, Job(status=status, queue="gpu", options={}, **fields))


def job_folder(settings: Settings, job_id: int) -> Path:
    folder = settings.jobs_dir / str(job_id)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "model.pth").write_bytes(b"weights")
    (folder / "job.log").write_text("log\n")
    return folder


def count(client: TestClient, model: Any, *where: Any) -> int:
    with db(client) as session:
        return int(session.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def add_dataset(client: TestClient, settings: Settings, splits: dict[str, Any]) -> tuple[int, int]:
    """A converted dataset: its row, its succeeded convert job, shards and the job's log."""
    dataset_id = add(client, Dataset(name="d", splits=splits, shards_dir="x"))
    convert = add_job(client, action="dataset_convert", dataset_id=dataset_id)
    with db(client) as session:
        session.get_one(Dataset, dataset_id).convert_job_id = convert
        session.commit()
    shards = settings.data_root / "datasets" / str(dataset_id) / "shards"
    shards.mkdir(parents=True)
    (shards / "train-00000-of-00001.tfrecord").write_bytes(b"shard")
    job_folder(settings, convert)
    return dataset_id, convert


def upload(settings: Settings) -> tuple[str, dict[str, Any]]:
    """An extracted upload folder and dataset splits pointing into it."""
    name = uuid.uuid4().hex
    folder = settings.data_root / "uploads" / name
    (folder / "images").mkdir(parents=True)
    (folder / "train.json").write_text("{}")
    base = f"uploads/{name}"
    return name, {"train": {"image_dir": f"{base}/images", "annotation_file": f"{base}/train.json"}}


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- jobs ---------------------------------------------------------------------------


def test_delete_finished_job_removes_row_metrics_key_and_artifacts(
    client: TestClient, settings: Settings
) -> None:
    job_id = add_job(client)
    add(client, JobMetric(job_id=job_id, step=1, values={"loss": 1.0}))
    add(
        client, IdempotencyKey(key="k", endpoint="POST /jobs", request_hash="h", resource_id=job_id)
    )
    folder = job_folder(settings, job_id)
    kept = add_job(client)
    assert client.get(f"/jobs/{job_id}").status_code == 200

    response = client.delete(f"/jobs/{job_id}")

    assert response.status_code == 204, response.text
    assert not folder.exists()
    assert client.get(f"/jobs/{job_id}").status_code == 404
    assert client.get(f"/jobs/{job_id}/artifacts").status_code == 404
    assert count(client, JobMetric) == 0
    assert count(client, IdempotencyKey) == 0
    assert client.get(f"/jobs/{kept}").status_code == 200
    assert client.delete(f"/jobs/{job_id}").status_code == 404


@pytest.mark.parametrize("status", [JobStatus.queued, JobStatus.running, JobStatus.cancelling])
def test_unfinished_job_is_refused(
    client: TestClient, settings: Settings, status: JobStatus
) -> None:
    job_id = add_job(client, status)
    folder = job_folder(settings, job_id)
    response = client.delete(f"/jobs/{job_id}")
    assert response.status_code == 409
    assert response.json()["detail"] == f"job {job_id} is {status}; cancel it first"
    assert folder.is_dir()
    assert client.get(f"/jobs/{job_id}").json()["status"] == status


def test_job_with_dependants_is_refused_naming_them(client: TestClient, settings: Settings) -> None:
    export = add_job(client, action="export")
    child = add_job(client, action="publish", parent_job_id=export)
    add(client, PublishedModel(name="shapes", version=1, job_id=export, published=False))
    folder = job_folder(settings, export)
    response = client.delete(f"/jobs/{export}")
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert f"job {child}" in detail and "model 'shapes' version 1" in detail
    assert folder.is_dir() and count(client, Job) == 2 and count(client, PublishedModel) == 1


def test_a_datasets_convert_job_is_refused(client: TestClient, settings: Settings) -> None:
    dataset_id, convert = add_dataset(client, settings, {})
    response = client.delete(f"/jobs/{convert}")
    assert response.status_code == 409
    assert f"dataset {dataset_id}" in response.json()["detail"]
    assert (settings.jobs_dir / str(convert)).is_dir()


def test_deleted_job_is_not_served_from_any_processs_cache(
    client: TestClient, settings: Settings
) -> None:
    job_id = add_job(client)
    with TestClient(
        base_url="http://localhost", app=create_app(settings)
    ) as other:  # a second API process's cache
        assert cache_of(other).wait_live(10)
        for api in (client, other):
            api.get(f"/jobs/{job_id}")
            hits = cache_of(api).hits
            assert api.get(f"/jobs/{job_id}").status_code == 200
            assert cache_of(api).hits == hits + 1, "the poll was not served from memory"

        assert client.delete(f"/jobs/{job_id}").status_code == 204

        assert cache_of(client).body(job_id) is None  # dropped at once, by the API itself
        assert client.get(f"/jobs/{job_id}").status_code == 404
        assert eventually(lambda: cache_of(other).body(job_id) is None), "still cached"
        assert other.get(f"/jobs/{job_id}").status_code == 404


def test_a_folder_that_cannot_be_removed_is_logged_not_a_500(
    client: TestClient, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = add_job(client)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    (settings.jobs_dir / str(job_id)).symlink_to(elsewhere)  # rmtree refuses symlinks
    with caplog.at_level(logging.ERROR, logger="maskops_api.services.deletion"):
        assert client.delete(f"/jobs/{job_id}").status_code == 204
    assert f"could not remove jobs/{job_id}" in caplog.text
    assert client.get(f"/jobs/{job_id}").status_code == 404
    assert elsewhere.is_dir()


def test_deleting_needs_write_access(settings: Settings) -> None:
    exposed = settings.model_copy(update={"auth": "required"})
    with TestClient(base_url="http://localhost", app=create_app(exposed)) as api:
        job_id = add_job(api)
        with db(api) as session:
            _, read = create_token(session, name="reader", scope=TokenScope.read)
            _, write = create_token(session, name="writer", scope=TokenScope.write)
        assert api.delete(f"/jobs/{job_id}").status_code == 401
        denied = api.delete(f"/jobs/{job_id}", headers={"Authorization": f"Bearer {read}"})
        assert denied.status_code == 403
        assert count(api, Job) == 1
        allowed = api.delete(f"/jobs/{job_id}", headers={"Authorization": f"Bearer {write}"})
        assert allowed.status_code == 204


# --- datasets -----------------------------------------------------------------------


def test_delete_uploaded_dataset_removes_rows_shards_convert_job_and_upload(
    client: TestClient, settings: Settings
) -> None:
    name, splits = upload(settings)
    dataset_id, convert = add_dataset(client, settings, splits)
    add(client, IdempotencyKey(key="k", endpoint="POST /datasets", request_hash="h",
                               resource_id=dataset_id))  # fmt: skip
    client.get(f"/jobs/{convert}")  # cached

    assert client.delete(f"/datasets/{dataset_id}").status_code == 204

    assert client.get(f"/datasets/{dataset_id}").status_code == 404
    assert client.get(f"/jobs/{convert}").status_code == 404
    assert not (settings.data_root / "datasets" / str(dataset_id)).exists()
    assert not (settings.jobs_dir / str(convert)).exists()
    assert not (settings.data_root / "uploads" / name).exists()
    assert count(client, Dataset) == count(client, Job) == count(client, IdempotencyKey) == 0


def test_registered_datasets_files_and_shared_uploads_stay(
    client: TestClient, settings: Settings
) -> None:
    own = settings.data_root / "mine" / "train.json"
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text("{}")
    registered, _ = add_dataset(
        client, settings, {"train": {"image_dir": "mine", "annotation_file": "mine/train.json"}}
    )
    name, splits = upload(settings)
    first, _ = add_dataset(client, settings, splits)
    add_dataset(client, settings, splits)  # a second dataset reading the same upload
    assert client.delete(f"/datasets/{registered}").status_code == 204
    assert client.delete(f"/datasets/{first}").status_code == 204
    assert own.is_file()
    assert (settings.data_root / "uploads" / name / "train.json").is_file()
    assert not (settings.data_root / "datasets" / str(first)).exists()


def test_dataset_in_use_is_refused_naming_its_users(client: TestClient, settings: Settings) -> None:
    dataset_id, convert = add_dataset(client, settings, {})
    experiment = add(client, Experiment(name="e", dataset_id=dataset_id))
    train = add_job(client, dataset_id=dataset_id)
    response = client.delete(f"/datasets/{dataset_id}")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"dataset {dataset_id} is still used by experiment {experiment}, job {train}; "
        "delete those first"
    )
    assert client.get(f"/datasets/{dataset_id}").status_code == 200
    assert (settings.data_root / "datasets" / str(dataset_id) / "shards").is_dir()
    assert (settings.jobs_dir / str(convert)).is_dir()


def test_dataset_being_converted_is_refused(client: TestClient, settings: Settings) -> None:
    dataset_id, convert = add_dataset(client, settings, {})
    with db(client) as session:
        session.get_one(Job, convert).status = JobStatus.running
        session.commit()
    response = client.delete(f"/datasets/{dataset_id}")
    assert response.status_code == 409
    assert response.json()["detail"] == f"job {convert} is running; cancel it first"
    assert count(client, Dataset) == 1 and count(client, Job) == 1


# --- experiments --------------------------------------------------------------------


def test_delete_experiment_removes_it_and_its_versions(client: TestClient) -> None:
    experiment = add(client, Experiment(name="e", last_version_number=2))
    for version in (1, 2):
        add(client, ExperimentVersion(experiment_id=experiment, version=version, spec={}))
    kept = add(client, Experiment(name="kept"))
    add(client, ExperimentVersion(experiment_id=kept, version=1, spec={}))
    assert client.delete(f"/experiments/{experiment}").status_code == 204
    assert client.get(f"/experiments/{experiment}").status_code == 404
    assert count(client, ExperimentVersion) == 1
    assert client.get(f"/experiments/{kept}").status_code == 200


def test_experiment_with_jobs_is_refused(client: TestClient) -> None:
    experiment = add(client, Experiment(name="e"))
    add(client, ExperimentVersion(experiment_id=experiment, version=1, spec={}))
    jobs = [add_job(client, experiment_id=experiment, experiment_version=1) for _ in range(2)]
    response = client.delete(f"/experiments/{experiment}")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"experiment {experiment} is still used by job {jobs[0]}, job {jobs[1]}; delete those first"
    )
    assert count(client, ExperimentVersion) == 1


# --- models -------------------------------------------------------------------------


def repository(settings: Settings, name: str) -> list[Path]:
    folders = [settings.model_repository / p.format(name) for p in ("{}", *PARTS)]
    for folder in folders:
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(f'name: "{folder.name}"\n')
    return folders


def test_delete_unpublished_model_removes_rows_and_repository_folders(
    client: TestClient, settings: Settings
) -> None:
    export = add_job(client, action="export")
    for version in (1, 2):
        add(client, PublishedModel(name="shapes", version=version, job_id=export, published=False))
    add(client, PublishedModel(name="other", version=1, job_id=export, published=True))
    folders = repository(settings, "shapes")
    others = repository(settings, "other")

    assert client.delete("/models/shapes").status_code == 204

    assert client.get("/models/shapes").status_code == 404
    assert not any(f.exists() for f in folders)
    assert all(f.is_dir() for f in others)
    assert client.get("/models/other").status_code == 200
    assert client.delete("/models/shapes").status_code == 404


def test_published_model_is_refused(client: TestClient, settings: Settings) -> None:
    export = add_job(client, action="export")
    add(client, PublishedModel(name="shapes", version=1, job_id=export, published=False))
    add(client, PublishedModel(name="shapes", version=2, job_id=export, published=True))
    folders = repository(settings, "shapes")
    response = client.delete("/models/shapes")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "model 'shapes' is published (version 2); unpublish it first"
    )
    assert all(f.is_dir() for f in folders) and count(client, PublishedModel) == 2


def test_model_being_published_is_refused(client: TestClient, settings: Settings) -> None:
    export = add_job(client, action="export")
    add(client, PublishedModel(name="shapes", version=1, job_id=export, published=False))
    publish = add_job(client, JobStatus.queued, action="publish", parent_job_id=export)
    with db(client) as session:
        session.get_one(Job, publish).options = {"name": "shapes"}
        session.commit()
    response = client.delete("/models/shapes")
    assert response.status_code == 409
    assert f"job {publish}" in response.json()["detail"]
    assert count(client, PublishedModel) == 1
