"""A search's job page in a real browser: the trials table, the metric by trial and the
parameter-against-metric scatter, drawn from ``GET /automl/{id}`` of the real API.

The search is written as its controller writes one (the jobs, the experiment versions,
the study in the test's Postgres schema): the searches that really train are in
test_automl.py; this test is about what the page shows of one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import create_engine, text

from maskops_core import automl as searches
from maskops_core.db.models import Experiment, ExperimentVersion, Job, JobStatus
from maskops_core.db.session import make_engine, make_session_factory, transaction
from maskops_core.settings import Settings
from tests.integration.api.test_dashboard import (  # noqa: F401
    _js,
    _no_csp_violations,
    _open,
    _screenshot,
    server,
    token,
)
from tests.integration.api.test_docs_ui import _wait, browser  # noqa: F401

pytestmark = pytest.mark.integration

LEARNING_RATES = (0.02, 0.001, 0.005)
VALUES = (0.31, None, 0.42)  # the second trial was pruned


def _seed_search(settings: Settings) -> int:
    """A finished search of three trials (complete, pruned, complete); its job id."""
    factory = make_session_factory(make_engine(settings))
    with transaction(factory) as session:
        experiment = Experiment(name="searched", last_version_number=1)
        session.add(experiment)
        session.flush()
        session.add(ExperimentVersion(experiment_id=experiment.id, version=1, spec={}))
        search = Job(
            action="automl",
            status=JobStatus.succeeded,
            experiment_id=experiment.id,
            experiment_version=1,
            options={"metric": "mask_AP"},
            queue="cpu",
        )
        session.add(search)
        session.flush()
        search_id, experiment_id = search.id, experiment.id
    study = optuna.create_study(
        study_name=searches.study_name(search_id),
        storage=searches.study_storage(settings),
        direction="maximize",
    )
    study.set_user_attr("metric", "mask_AP")
    lr = optuna.distributions.FloatDistribution(1e-4, 0.1, log=True)
    for number, (rate, value) in enumerate(zip(LEARNING_RATES, VALUES, strict=True)):
        state = optuna.trial.TrialState.COMPLETE if value else optuna.trial.TrialState.PRUNED
        study.add_trial(
            optuna.trial.create_trial(
                params={"init_learning_rate": rate},
                distributions={"init_learning_rate": lr},
                value=value,
                intermediate_values={2: (value or 0.05) - 0.01},
                state=state,
            )
        )
        spec = {"init_learning_rate": rate}
        job = searches.create_trial_job(
            factory, search_id, trial=number, spec=spec, options={}, queue="gpu"
        )
        with transaction(factory) as session:
            session.get_one(Job, job.id).status = JobStatus.succeeded
    assert experiment_id
    return search_id


@pytest.fixture
def clean_studies(clean_db: Settings) -> Settings:
    engine = create_engine(
        clean_db.database_url,
        connect_args={"options": f"-csearch_path={clean_db.database_schema}"},
    )
    tables = ", ".join(f'"{n}"' for n in searches.study_tables() if n != "version_info")
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()
    return clean_db


def test_search_page_shows_trials_and_both_charts(
    clean_studies: Settings,
    server: str,  # noqa: F811
    token: str,  # noqa: F811
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    search_id = _seed_search(clean_studies)
    _open(browser, f"{server}/ui/jobs/{search_id}", token)
    _wait(
        browser,
        lambda: _js(browser, "return document.getElementById('trials').dataset.rows") == "3",
        "the search's trials were not listed",
    )
    table = browser.find_element("id", "trials").text
    assert "complete" in table and "pruned" in table and "init_learning_rate=0.005" in table
    assert "best: trial 2, mask_AP 0.42" in browser.find_element("id", "automl-best").text
    points = _js(
        browser,
        "return ['trial-chart', 'param-chart'].map((id) => Chart.getChart(id).data.datasets"
        ".map((d) => [d.label, d.data.map((p) => [p.x, p.y])]))",
    )
    by_trial, by_param = (dict(chart) for chart in points)
    assert by_trial["complete"] == [[0, 0.31], [2, 0.42]]
    assert by_trial["pruned"] == [[1, pytest.approx(0.04)]]  # its last evaluation
    assert by_param["complete"] == [[0.02, 0.31], [0.005, 0.42]]
    _screenshot(browser, "dashboard-automl.png", 1400)
    _no_csp_violations(browser)
