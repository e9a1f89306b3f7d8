"""Checks of experiment versions that run alike on SQLite (the embedded stack's database,
unit tests) and on Postgres (integration tests): an AutoML search's trial versions never
become the default version, and migration 0010 marks the existing ones."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from maskops_core import automl as searches
from maskops_core.db.migrate import migrate
from maskops_core.db.session import make_engine
from maskops_core.settings import Settings


def check_trial_versions_are_never_the_default(
    client: httpx.Client, factory: sessionmaker[Session], experiment_id: int
) -> None:
    """A search of the experiment (at version 1) makes two trial versions as its controller
    does; what names no version still gets the user's newest version, and a spec update
    takes the number after the trials'."""
    user = client.get(f"/experiments/{experiment_id}").json()
    search = client.post("/automl", json={"experiment_id": experiment_id, "options": {}})
    assert search.status_code == 202, search.text
    search_id = search.json()["job"]["id"]
    for trial, rate in enumerate((0.003, 0.03)):
        trial_spec = {**user["spec"], "init_learning_rate": rate}
        job = searches.create_trial_job(
            factory, search_id, trial=trial, spec=trial_spec, options={}, queue="gpu"
        )
        assert job.experiment_version == 2 + trial
    shown = client.get(f"/experiments/{experiment_id}").json()
    assert (shown["version"], shown["latest_version"], shown["search_job_id"]) == (1, 1, None)
    assert shown["spec"] == user["spec"]
    trial_view = client.get(f"/experiments/{experiment_id}", params={"version": 3}).json()
    assert (trial_view["version"], trial_view["latest_version"]) == (3, 1)
    assert trial_view["search_job_id"] == search_id
    assert trial_view["spec"]["init_learning_rate"] == 0.03
    assert _plain_job(client, "train", experiment_id) == 1
    assert _plain_job(client, "automl", experiment_id) == 1  # a second search starts from it

    changed = {**user["spec"], "init_learning_rate": 0.02}
    updated = client.put(f"/experiments/{experiment_id}", json={"spec": changed})
    assert updated.status_code == 200, updated.text
    assert (updated.json()["version"], updated.json()["latest_version"]) == (4, 4)
    assert updated.json()["search_job_id"] is None
    assert _plain_job(client, "train", experiment_id) == 4
    listed = client.get("/experiments").json()["items"]
    assert [(e["id"], e["latest_version"]) for e in listed] == [(experiment_id, 4)]
    text = client.get(f"/experiments/{experiment_id}/spec.txt").text
    assert "init_learning_rate: 0.02" in text, text


def _plain_job(client: httpx.Client, action: str, experiment_id: int) -> int:
    """The experiment version of a job that names none."""
    response = client.post("/jobs", json={"action": action, "experiment_id": experiment_id})
    assert response.status_code == 202, response.text
    return int(response.json()["experiment_version"])


_NOW = datetime(2026, 1, 1, tzinfo=UTC)
_EXPERIMENTS = sa.table(
    "experiments",
    sa.column("id", sa.Integer),
    sa.column("name", sa.String),
    sa.column("latest_version", sa.Integer),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)
_VERSIONS = sa.table(
    "experiment_versions",
    sa.column("experiment_id", sa.Integer),
    sa.column("version", sa.Integer),
    sa.column("spec", sa.JSON),
    sa.column("created_at", sa.DateTime(timezone=True)),
)
_JOBS = sa.table(
    "jobs",
    sa.column("id", sa.Integer),
    sa.column("action", sa.String),
    sa.column("status", sa.String),
    sa.column("experiment_id", sa.Integer),
    sa.column("experiment_version", sa.Integer),
    sa.column("parent_job_id", sa.Integer),
    sa.column("options", sa.JSON),
    sa.column("queue", sa.String),
    sa.column("attempts", sa.Integer),
    sa.column("dispatch_count", sa.Integer),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)


def _job(
    job_id: int, action: str, version: int, parent: int | None, **options: Any
) -> dict[str, Any]:
    return {
        "id": job_id,
        "action": action,
        "status": "succeeded",
        "experiment_id": 1,
        "experiment_version": version,
        "parent_job_id": parent,
        "options": options,
        "queue": "q",
        "attempts": 1,
        "dispatch_count": 1,
        "created_at": _NOW,
        "updated_at": _NOW,
    }


def check_migration_0010(settings: Settings) -> None:
    """A database at 0009 with a search (job 1, on version 1) whose two trials made versions
    2 and 3, a user's version 4, and a train job of the user's on version 4 under the
    search: 0010 marks versions 2 and 3 only, and the downgrade gives the columns back."""
    migrate(settings, "0009")
    engine = make_engine(settings)
    with engine.begin() as conn:
        conn.execute(
            _EXPERIMENTS.insert().values(
                id=1, name="e", latest_version=4, created_at=_NOW, updated_at=_NOW
            )
        )
        conn.execute(
            _VERSIONS.insert(),
            [
                {"experiment_id": 1, "version": version, "spec": {}, "created_at": _NOW}
                for version in (1, 2, 3, 4)
            ],
        )
        conn.execute(
            _JOBS.insert(),
            [
                _job(1, "automl", 1, None),
                _job(2, "train", 2, 1, trial=0),
                _job(3, "train", 3, 1, trial=1),
                _job(4, "train", 4, 1),
            ],
        )
    engine.dispose()
    migrate(settings, "head")
    engine = make_engine(settings)
    with engine.connect() as conn:
        marks = conn.execute(
            sa.text("SELECT version, search_job_id FROM experiment_versions ORDER BY version")
        ).all()
        assert [tuple(row) for row in marks] == [(1, None), (2, 1), (3, 1), (4, None)]
        assert conn.execute(sa.text("SELECT last_version_number FROM experiments")).scalar() == 4
    engine.dispose()
    migrate(settings, "0009", down=True)
    engine = make_engine(settings)
    with engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("experiment_versions")}
        assert "search_job_id" not in columns
        assert conn.execute(sa.text("SELECT latest_version FROM experiments")).scalar() == 4
        assert conn.execute(sa.text("SELECT count(*) FROM experiment_versions")).scalar() == 4
    engine.dispose()
    migrate(settings, "head")
