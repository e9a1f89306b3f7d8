"""``GET /automl/{id}`` on a real study (Optuna on the SQLite control-plane database):
a trial the study still counts running while its search was cancelled shows as
interrupted, to be resumed with the search."""

from __future__ import annotations

import optuna
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from maskops_core import automl as searches
from maskops_core.db.models import Job
from maskops_core.settings import Settings


def test_a_cancelled_searchs_running_trial_is_interrupted(
    client: TestClient, settings: Settings, factory: sessionmaker[Session]
) -> None:
    with factory() as session, session.begin():
        search = Job(action="automl", status="running", queue="t_cpu", options={})
        session.add(search)
        session.flush()
        session.add(
            Job(
                action="train",
                status="running",
                queue="t_gpu",
                parent_job_id=search.id,
                options={"trial": 0},
            )
        )
    study = optuna.create_study(
        study_name=searches.study_name(search.id), storage=searches.study_storage(settings)
    )
    study.ask({"init_learning_rate": optuna.distributions.FloatDistribution(0.001, 0.05)})

    def state() -> str:
        response = client.get(f"/automl/{search.id}")
        assert response.status_code == 200, response.text
        return str(response.json()["trials"][0]["state"])

    assert state() == "running"
    # Cancelled: the trial's job stops, the study keeps the trial for the resumed search.
    with factory() as session, session.begin():
        for job in session.query(Job):
            job.status = "cancelled"
    assert state() == "interrupted"
