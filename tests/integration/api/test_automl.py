"""AutoML searches end to end: real Celery worker processes run the search's controller
and its trials (train jobs of a few steps on the demo data), Optuna's study lives in the
test's Postgres schema, the ASHA pruner really prunes, and a search whose whole stack is
SIGKILLed mid-run finishes without losing a finished trial."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from maskops_core.automl import study_tables
from maskops_core.db.models import Dataset
from maskops_core.db.session import make_engine, make_session_factory, transaction
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker, wait_for
from tests.integration.api.test_reliability import _reconcile
from tests.integration.api.test_workflow import create_experiment, register_demo
from tests.support.experiment_versions import check_trial_versions_are_never_the_default

pytestmark = pytest.mark.integration

GOOD_LR, BAD_LR = 0.008, 0.00001
SEARCH: dict[str, Any] = {
    # TAO API's names for the algorithm and the number of trials.
    "automl_algorithm": "random",
    "automl_max_recommendations": 4,
    "max_concurrent": 2,
    "pruner": "asha",
    "reduction_factor": 2,
    "metric": "val/Total loss",
    "hyperparameters": {"init_learning_rate": {"choices": [GOOD_LR, BAD_LR]}},
    # This seed samples BAD, GOOD, BAD, BAD: after a good trial's first evaluation, each
    # later bad one is worse at the same step, which ASHA stops (a learning rate of 1e-5
    # leaves the loss where it started).
    "seed": 0,
}


@pytest.fixture
def clean_studies(clean_db: Settings) -> Settings:
    """No study of an earlier test (job ids restart with the tables, and so would the
    study names)."""
    engine = create_engine(
        clean_db.database_url,
        connect_args={"options": f"-csearch_path={clean_db.database_schema}"},
    )
    tables = ", ".join(f'"{name}"' for name in study_tables() if name != "version_info")
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()
    return clean_db


def _start_search(
    client: TestClient,
    worker: Worker,
    demo_root: str,
    steps: int,
    options: dict[str, Any] = SEARCH,
) -> int:
    dataset_id = register_demo(client, demo_root, worker)
    experiment_id = create_experiment(client, dataset_id, steps=steps, every=2)
    response = client.post("/automl", json={"experiment_id": experiment_id, "options": options})
    assert response.status_code == 202, response.text
    search = response.json()
    assert search["job"]["action"] == "automl" and search["trials"] == []
    return int(search["job"]["id"])


def _search(client: TestClient, job_id: int) -> dict[str, Any]:
    response = client.get(f"/automl/{job_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_search_runs_trials_as_train_jobs_prunes_and_shows_the_best(
    client: TestClient,
    clean_studies: Settings,
    workers: Callable[[str], Worker],
    demo_root: str,
) -> None:
    started = [workers(name) for name in ("w1", "w2", "w3")]  # the controller + 2 trials
    job_id = _start_search(client, started[0], demo_root, steps=4)
    job = wait_for(client, job_id, {"succeeded", "failed"}, timeout=420, worker=started[0])
    assert job["status"] == "succeeded", client.get(f"/jobs/{job_id}/logs").text

    search = _search(client, job_id)
    trials = search["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    assert [t["params"]["init_learning_rate"] for t in trials] == [BAD_LR, GOOD_LR, BAD_LR, BAD_LR]
    states = [t["state"] for t in trials]
    assert "pruned" in states and "complete" in states and "fail" not in states, trials
    for trial in trials:
        # Every trial is an ordinary train job of the search, on its own spec version.
        child = client.get(f"/jobs/{trial['job_id']}").json()
        assert child["action"] == "train" and child["parent_job_id"] == job_id
        assert child["status"] == "succeeded" and child["options"]["trial"] == trial["number"]
        assert "2" in trial["intermediate"]
        version = client.get(
            f"/experiments/{child['experiment_id']}/spec.txt",
            params={"version": child["experiment_version"]},
        )
        lr = trial["params"]["init_learning_rate"]
        assert f"init_learning_rate: {lr}" in version.text, version.text
        pruned = trial["state"] == "pruned"
        assert (child["result"]["step"] < 4) == pruned, child
    assert len({t["experiment_version"] for t in trials}) == 4
    # The trials' versions are the search's: the experiment's default is still the user's.
    experiment = client.get(f"/experiments/{child['experiment_id']}").json()
    assert (experiment["version"], experiment["latest_version"]) == (1, 1)

    best = search["best"]
    assert best["params"]["init_learning_rate"] == GOOD_LR and best["state"] == "complete"
    assert search["metric"] == "val/Total loss" and search["direction"] == "minimize"
    assert f"init_learning_rate: {GOOD_LR}" in search["best_spec_text"]
    assert search["best_checkpoint"].endswith(".pth")
    # The best trial's model is ready for the follow-up jobs.
    evaluate = client.post(
        "/jobs", json={"action": "evaluate", "parent_job_id": best["job_id"]}
    ).json()
    assert wait_for(client, evaluate["id"], {"succeeded", "failed"})["status"] == "succeeded"
    assert job["result"]["best"]["job_id"] == best["job_id"]
    assert client.get(f"/automl/{best['job_id']}").status_code == 404  # a train job


def test_trial_versions_are_never_the_default_version(
    client: TestClient, clean_db: Settings
) -> None:
    """On Postgres: with a search's trial versions made (as its controller makes them, no
    worker needed), a train job naming no version runs the user's newest version, which
    GET /experiments reports, and an update takes the number after the trials'."""
    engine = make_engine(clean_db)
    factory = make_session_factory(engine)
    with transaction(factory) as session:
        dataset = Dataset(name="converted", splits={}, shards_dir="shards")
        session.add(dataset)
        session.flush()
        dataset_id = dataset.id
    try:
        experiment_id = create_experiment(client, dataset_id, steps=4, every=2)
        check_trial_versions_are_never_the_default(client, factory, experiment_id)
    finally:
        engine.dispose()


def test_search_space_is_checked_at_the_door(
    client: TestClient, clean_studies: Settings, workers: Callable[[str], Worker], demo_root: str
) -> None:
    dataset_id = register_demo(client, demo_root, workers("w1"))
    experiment_id = create_experiment(client, dataset_id, steps=4, every=2)
    cases = {
        "maskrcnn_config.no_such_field": {"min": 1, "max": 2},
        "init_learning_rate": {"min": -1.0, "max": 0.1, "log": True},
        "maskrcnn_config.rpn_batch_size_per_im": {"choices": [0, 64]},
        # Values the schema takes but the server refuses from POST /experiments: its limits
        # and its path confinement hold for every choice and both ends of every range.
        "data_config.num_classes": {"min": 2, "max": 1_000_000_000},
        "checkpoint": {"choices": ["", "/etc/hostname"]},
        "data_config.training_file_pattern": {"choices": ["/etc/*"]},
    }
    for field, given in cases.items():
        body = {"experiment_id": experiment_id, "options": {"hyperparameters": {field: given}}}
        response = client.post("/automl", json=body)
        assert response.status_code == 422, response.text
        assert f"options.hyperparameters.{field}" in response.json()["detail"], response.text
    assert client.get(f"/experiments/{experiment_id}").json()["latest_version"] == 1
    unknown = client.post(
        "/automl", json={"experiment_id": experiment_id, "options": {"automl_algorithm": "grid"}}
    )
    assert unknown.status_code == 422 and "options.automl_algorithm" in unknown.text
    sampler = client.post(
        "/automl", json={"experiment_id": experiment_id, "options": {"sampler": "cmaes"}}
    )
    assert sampler.status_code == 422 and "options.sampler" in sampler.text, sampler.text
    assert "'gp', 'tpe' or 'random'" in sampler.text, sampler.text
    trial = client.post(
        "/jobs", json={"action": "train", "experiment_id": experiment_id, "options": {"trial": 0}}
    )
    assert trial.status_code == 422 and "options.trial" in trial.text


def _trial_jobs(client: TestClient, job_id: int) -> list[dict[str, Any]]:
    jobs = client.get("/jobs", params={"action": "train", "limit": 50}).json()["items"]
    return [j for j in jobs if j["parent_job_id"] == job_id]


def test_sigkilled_stack_mid_search_resumes_and_loses_no_finished_trial(
    client: TestClient,
    clean_studies: Settings,
    workers: Callable[[str], Worker],
    demo_root: str,
) -> None:
    first = [workers(name) for name in ("w1", "w2", "w3")]
    # No pruner, and a trial killed at least 3 steps before its end: a trial that its
    # pruner stopped, or that finished, between this test's last look and the kill would
    # leave nothing interrupted.
    steps = 8
    job_id = _start_search(client, first[0], demo_root, steps, {**SEARCH, "pruner": "none"})

    def finished_and_one_past_its_checkpoint(_: dict[str, Any]) -> bool:
        trials = _trial_jobs(client, job_id)
        done = [t for t in trials if t["status"] == "succeeded"]
        running = [t for t in trials if t["status"] == "running"]
        return bool(done) and any(3 <= (t["progress"]["step"] or 0) <= steps - 3 for t in running)

    wait_for(client, job_id, {"running"}, timeout=420, until=finished_and_one_past_its_checkpoint)
    for worker in first:
        worker.kill()
    before = {t["id"]: t for t in _trial_jobs(client, job_id)}
    done_before = {i: t for i, t in before.items() if t["status"] == "succeeded"}
    interrupted = [i for i, t in before.items() if t["status"] == "running"]
    assert done_before and interrupted, before

    # The heartbeats go stale; the reconciler (an hour "later") requeues and re-sends the
    # search's controller and its interrupted trials.
    report = _reconcile(clean_studies, seconds_later=3600)
    assert job_id in report.requeued  # type: ignore[attr-defined]
    assert set(interrupted) <= set(report.requeued)  # type: ignore[attr-defined]
    second = [workers(name) for name in ("w4", "w5", "w6")]
    job = wait_for(client, job_id, {"succeeded", "failed"}, timeout=420, worker=second[0])
    assert job["status"] == "succeeded", client.get(f"/jobs/{job_id}/logs").text
    assert job["attempts"] == 2  # the controller, too, was killed and resumed

    search = _search(client, job_id)
    assert len(search["trials"]) == 4 and all(t["state"] != "running" for t in search["trials"])
    after = {t["id"]: t for t in _trial_jobs(client, job_id)}
    assert len(after) == 4  # no trial asked twice
    for trial_job_id, done in done_before.items():
        # A finished trial is kept as it was: not run again, same metrics.
        assert after[trial_job_id]["attempts"] == 1
        assert after[trial_job_id]["result"] == done["result"]
    for trial_job_id in interrupted:
        logs = client.get(f"/jobs/{trial_job_id}/logs").text
        assert after[trial_job_id]["attempts"] == 2, logs
        # One past its step-2 checkpoint resumes from it; the other trial running at the
        # kill may have just started, with no checkpoint to resume from.
        if (before[trial_job_id]["progress"]["step"] or 0) >= 3:
            assert re.search(r"resuming from \S+model\.step-\d+\.pth", logs), logs
