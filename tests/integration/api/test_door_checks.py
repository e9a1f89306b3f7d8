"""Bad input refused at the door with a 4xx naming what is wrong, against the real app on
Postgres and Redis (no worker: these jobs must never reach one)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from maskops_core.db.models import Dataset, Job
from maskops_core.dispatch import dispatch_job
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker, wait_for

pytestmark = pytest.mark.integration

COCO: dict[str, list[object]] = {"images": [], "annotations": [], "categories": []}


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


SPEC = {
    "total_steps": 4,
    "train_batch_size": 1,
    "data_config": {"image_size": [128, 128], "num_classes": 4},
    "maskrcnn_config": {"nlayers": 10},
}


def _spec(**changes: object) -> dict[str, object]:
    spec = json.loads(json.dumps(SPEC))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = spec
        for key in parents:
            target = target[key]
        target[leaf] = value
    return spec


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"data_config__num_classes": 1_000_000_000}, "data_config.num_classes"),
        ({"train_batch_size": 100_000}, "train_batch_size"),
        ({"eval_batch_size": 1000}, "eval_batch_size"),
        ({"data_config__image_size": [8192, 8192]}, "data_config.image_size"),
        ({"train_batch_size": 64, "data_config__image_size": [2048, 2048]}, "train_batch_size"),
        ({"data_config__max_num_instances": 10**7}, "data_config.max_num_instances"),
    ],
)
def test_specs_beyond_what_a_worker_can_hold_are_422(
    client: TestClient, changes: dict[str, object], field: str
) -> None:
    response = client.post("/experiments", json={"name": "big", "spec": _spec(**changes)})
    assert response.status_code == 422, response.text
    assert f"spec: {field}: " in response.json()["detail"]
    assert client.get("/experiments").json()["total"] == 0
    # A new version is held to the same limits.
    experiment = client.post("/experiments", json={"name": "ok", "spec": SPEC}).json()
    response = client.put(f"/experiments/{experiment['id']}", json={"spec": _spec(**changes)})
    assert response.status_code == 422 and f"spec: {field}: " in response.json()["detail"]
    assert client.get(f"/experiments/{experiment['id']}").json()["latest_version"] == 1


def _insert_job(client: TestClient, **fields: object) -> int:
    factory = client.app.state.session_factory  # type: ignore[attr-defined]
    with factory() as session:
        job = Job(queue="gpu", **fields)
        session.add(job)
        session.commit()
        return int(job.id)


@pytest.fixture
def trained(client: TestClient, clean_db: Settings) -> dict[str, int]:
    """An experiment on a converted dataset, with a succeeded train job."""
    dataset = tiny_dataset(client, clean_db)
    factory = client.app.state.session_factory  # type: ignore[attr-defined]
    with factory() as session:
        session.execute(
            update(Dataset).where(Dataset.id == dataset["id"]).values(shards_dir="tiny/shards")
        )
        session.commit()
    experiment = client.post(
        "/experiments", json={"name": "e", "dataset_id": dataset["id"], "spec": SPEC}
    ).json()
    train = _insert_job(
        client,
        action="train",
        status="succeeded",
        experiment_id=experiment["id"],
        experiment_version=1,
        result={"checkpoint": "jobs/9/model.pth"},
    )
    return {"experiment": experiment["id"], "dataset": int(dataset["id"]), "train": train}  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("action", "options", "where"),
    [
        ("export", {"data_type": "int4"}, "options.data_type"),
        ("export", {"max_batch_size": 0}, "options.max_batch_size"),
        ("export", {"batch_size": True}, "options.batch_size"),
        ("export", {"max_batch_size": 4, "opt_batch_size": 8}, "options"),
        ("export", {"static_batch_size": 2, "min_batch_size": 1}, "options"),
        ("export", {"output_layout": "uff"}, "options.output_layout"),
        ("export", {"gen_ds_config": True, "output_layout": "maskops"}, "options"),
        ("prune", {"threshold": 0.5, "thresold": 0.5}, "options.thresold"),
        ("prune", {"norm": "L1"}, "options.norm"),
        ("prune", {"granularity": "8"}, "options.granularity"),
        ("inference", {"image_dir": "../../etc"}, "options.image_dir"),
        ("inference", {"threshold": 1.5}, "options.threshold"),
        ("evaluate", {"gpu_index": -1}, "options.gpu_index"),
        ("train", {"gpus": 65}, "options.gpus"),
        ("dataset_convert", {"anything": 1}, "options.anything"),
    ],
)
def test_action_options_are_validated_at_the_door(
    client: TestClient, trained: dict[str, int], action: str, options: dict, where: str
) -> None:
    body: dict[str, object] = {"action": action, "options": options}
    if action == "train" or action == "dataset_convert":
        body["experiment_id" if action == "train" else "dataset_id"] = trained[
            "experiment" if action == "train" else "dataset"
        ]
    else:
        body["parent_job_id"] = trained["train"]
    before = client.get("/jobs").json()["total"]
    response = client.post("/jobs", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(f"{where}: "), response.json()
    assert client.get("/jobs").json()["total"] == before


@pytest.mark.parametrize(
    ("options", "where"),
    [
        ({"gpus": 2}, "options.gpus"),  # no live worker offers two ranks
        ({"nodes": 2}, "options.nodes"),  # nor two workers
    ],
)
def test_ranks_no_live_worker_offers_are_409(
    client: TestClient, trained: dict[str, int], options: dict, where: str
) -> None:
    """Valid options (the document allows them), refused for the state of the workers."""
    body = {"action": "train", "experiment_id": trained["experiment"], "options": options}
    response = client.post("/jobs", json=body)
    assert response.status_code == 409, response.text
    assert response.json()["detail"].startswith(f"{where}: "), response.json()


def test_valid_options_are_accepted(client: TestClient, trained: dict[str, int]) -> None:
    parent = trained["train"]
    for action, options in (
        ("export", {"data_type": "int8", "max_batch_size": 4, "batches": 2, "batch_size": 1}),
        ("export", {"max_batch_size": 8, "min_batch_size": 2, "opt_batch_size": 4}),
        ("export", {"static_batch_size": 4}),
        ("export", {"gen_ds_config": True, "output_layout": "tao"}),
        ("prune", {"norm": "L2", "threshold": 0, "excluded_layers": ["backbone.body.conv1"]}),
        ("evaluate", {"gpu_index": 0}),
    ):
        response = client.post(
            "/jobs", json={"action": action, "parent_job_id": parent, "options": options}
        )
        assert response.status_code == 202, response.text
        assert response.json()["options"] == options


def test_train_with_zero_steps_is_409(client: TestClient, trained: dict[str, int]) -> None:
    changed = client.put(
        f"/experiments/{trained['experiment']}", json={"spec": _spec(total_steps=0)}
    )
    assert changed.status_code == 200, changed.text
    response = client.post(
        "/jobs", json={"action": "train", "experiment_id": trained["experiment"]}
    )
    # The request is valid; the experiment's version is what cannot train.
    assert response.status_code == 409 and "spec.total_steps" in response.json()["detail"]


def test_evaluating_a_cancelled_training_needs_its_checkpoint(
    client: TestClient, trained: dict[str, int]
) -> None:
    common = {"action": "train", "status": "cancelled", "experiment_id": trained["experiment"]}
    without = _insert_job(client, **common, experiment_version=1, result={"step": 0})
    response = client.post("/jobs", json={"action": "evaluate", "parent_job_id": without})
    assert response.status_code == 409, response.text
    assert "cancelled before writing a checkpoint" in response.json()["detail"]
    kept = _insert_job(
        client, **common, experiment_version=1, result={"step": 2, "checkpoint": "jobs/3/c.pth"}
    )
    response = client.post("/jobs", json={"action": "evaluate", "parent_job_id": kept})
    assert response.status_code == 202, response.text


def test_the_worker_reads_options_through_the_same_model(
    client: TestClient, clean_db: Settings, workers: Callable[[str], Worker]
) -> None:
    """A job whose options never passed the API (stored before the check, or written by
    hand) fails in the worker naming the option, before any model is loaded."""
    worker = workers("w1")
    factory = client.app.state.session_factory  # type: ignore[attr-defined]
    with factory() as session:
        job = Job(
            action="prune",
            queue=clean_db.gpu_queue,
            options={"threshold": 0.5, "thresold": 0.5},
        )
        session.add(job)
        session.commit()
        dispatch_job(factory, client.app.state.dispatcher, job)  # type: ignore[attr-defined]
        job_id = job.id
    done = wait_for(client, job_id, {"failed", "succeeded"}, timeout=120, worker=worker)
    assert done["status"] == "failed"
    assert done["error"].endswith("options.thresold: Extra inputs are not permitted"), done
