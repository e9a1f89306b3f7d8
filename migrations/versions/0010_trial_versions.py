"""experiment versions made by an AutoML search's trials are marked with the search, so that
they never become the experiment's default version

``experiment_versions.search_job_id`` names the search (its ``automl`` job) whose trial
made the version, NULL for a version a user made; the default version is the newest
unmarked one (:func:`maskops_core.experiments.default_version`). The versions existing
trials made (a train job with ``options.trial`` whose parent is an ``automl`` job) are
marked here. ``experiments.latest_version`` counted every number given out, trials' too:
it keeps that meaning under its new name ``last_version_number``.

Both changes are native ``ALTER TABLE`` statements on Postgres and on SQLite (3.25 and
later rename a column, 3.35 and later drop one): no table is recreated.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _trial_versions(bind: sa.Connection) -> set[tuple[int, int, int]]:
    """``(experiment id, version, search job id)`` of each version a search's trial made.

    ``options`` is read in Python: Postgres and SQLite query JSON differently, and a
    search has a handful of trials."""
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.Integer),
        sa.column("action", sa.String),
        sa.column("parent_job_id", sa.Integer),
        sa.column("experiment_id", sa.Integer),
        sa.column("experiment_version", sa.Integer),
        sa.column("options", sa.JSON),
    )
    parent = jobs.alias("parent")
    rows = bind.execute(
        sa.select(jobs.c.experiment_id, jobs.c.experiment_version, parent.c.id, jobs.c.options)
        .join(parent, parent.c.id == jobs.c.parent_job_id)
        .where(
            jobs.c.action == "train",
            parent.c.action == "automl",
            jobs.c.experiment_id.is_not(None),
            jobs.c.experiment_version.is_not(None),
        )
    )
    return {
        (experiment, version, search)
        for experiment, version, search, options in rows
        if isinstance(options, dict) and options.get("trial") is not None
    }


def upgrade() -> None:
    op.alter_column("experiments", "latest_version", new_column_name="last_version_number")
    op.add_column("experiment_versions", sa.Column("search_job_id", sa.Integer(), nullable=True))
    versions = sa.table(
        "experiment_versions",
        sa.column("experiment_id", sa.Integer),
        sa.column("version", sa.Integer),
        sa.column("search_job_id", sa.Integer),
    )
    bind = op.get_bind()
    for experiment, version, search in sorted(_trial_versions(bind)):
        bind.execute(
            versions.update()
            .where(versions.c.experiment_id == experiment, versions.c.version == version)
            .values(search_job_id=search)
        )


def downgrade() -> None:
    # The count of numbers given out stays as it is: the versions of trials keep theirs, so
    # a new version still gets a number of its own.
    op.drop_column("experiment_versions", "search_job_id")
    op.alter_column("experiments", "last_version_number", new_column_name="latest_version")
