"""Experiment spec versions: how a new one is numbered, and which one a job or a read that
names no version gets.

Every version of an experiment has its own number, whoever made it: a user (creating the
experiment, or updating its spec) or an AutoML search (one version per trial, marked with
the search's job id). The default version is the newest one a user made: a search's trial
versions never become what a plain ``train`` job, a new search or ``GET /experiments/{id}``
runs or shows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from maskops_core.db.models import Experiment, ExperimentVersion, utcnow


def default_version(session: Session, experiment_id: int) -> ExperimentVersion | None:
    """The version used where none is named: the newest one a user made (None only for an
    experiment without versions)."""
    return session.scalars(
        select(ExperimentVersion)
        .where(
            ExperimentVersion.experiment_id == experiment_id,
            ExperimentVersion.search_job_id.is_(None),
        )
        .order_by(ExperimentVersion.version.desc())
        .limit(1)
    ).first()


def find_version(session: Session, experiment_id: int, version: int) -> ExperimentVersion | None:
    """Version number ``version`` of the experiment, whoever made it."""
    return session.scalars(
        select(ExperimentVersion).where(
            ExperimentVersion.experiment_id == experiment_id, ExperimentVersion.version == version
        )
    ).one_or_none()


def version_or_default(
    session: Session, experiment_id: int, version: int | None
) -> ExperimentVersion | None:
    """Version number ``version`` of the experiment, or its default one where None."""
    if version is None:
        return default_version(session, experiment_id)
    return find_version(session, experiment_id, version)


def add_version(
    session: Session,
    experiment_id: int,
    spec: dict[str, Any],
    *,
    search_job_id: int | None = None,
) -> ExperimentVersion:
    """A new version holding ``spec`` with the experiment's next number; ``search_job_id``:
    the AutoML search it is a trial of (None: a user's version).

    The number is taken in one ``UPDATE ... RETURNING`` of the experiment's row, so two
    writers at once (two updates, a search's trials) never get the same one."""
    number = session.execute(
        update(Experiment)
        .where(Experiment.id == experiment_id)
        .values(last_version_number=Experiment.last_version_number + 1, updated_at=utcnow())
        .returning(Experiment.last_version_number)
    ).scalar_one()
    version = ExperimentVersion(
        experiment_id=experiment_id, version=number, spec=spec, search_job_id=search_job_id
    )
    session.add(version)
    session.flush()
    return version
