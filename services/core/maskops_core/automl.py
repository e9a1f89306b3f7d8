"""AutoML searches in the control plane: the Optuna storage on the control-plane database
(its tables created by migration 0009, next to maskops' own), and the trial jobs a search
creates, each one short transaction.

A search is an ``automl`` job; each trial is a ``train`` job whose parent is the search,
whose ``options.trial`` is the study trial's number and whose experiment version holds the
trial's spec (a version marked as the search's, never the experiment's default). The
database (the jobs and the study) is the whole state of a search: its controller
re-derives everything from it after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from maskops_core import experiments, job_state
from maskops_core.actions import JobAction
from maskops_core.db.models import TERMINAL_STATUSES, Job, JobStatus, utcnow
from maskops_core.db.session import transaction
from maskops_core.settings import Settings

if TYPE_CHECKING:
    from optuna.storages import RDBStorage


def study_tables() -> frozenset[str]:
    """The tables of Optuna's storage (migration 0009 makes them; Alembic's comparison of
    maskops' models with the database leaves them alone)."""
    from optuna.storages._rdb import models

    return frozenset(models.BaseModel.metadata.tables)


def study_name(search_job_id: int) -> str:
    """The Optuna study of search job ``search_job_id``."""
    return f"maskops-automl-job-{search_job_id}"


_storages: dict[str, RDBStorage] = {}


def study_storage(settings: Settings) -> RDBStorage:
    """Optuna's storage on the control-plane database (one per database per process).

    Its tables are made by the migrations, so Optuna neither creates them nor checks its
    schema version against ``alembic_version`` (which holds maskops' revision)."""
    from optuna.storages import RDBStorage

    key = f"{settings.database_url}|{settings.database_schema}"
    if key not in _storages:
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if settings.database_url.startswith("sqlite"):
            kwargs["connect_args"] = {"timeout": 30}
        elif settings.database_schema:
            kwargs["connect_args"] = {"options": f"-csearch_path={settings.database_schema}"}
        _storages[key] = RDBStorage(
            settings.database_url,
            engine_kwargs=kwargs,
            skip_compatibility_check=True,
            skip_table_creation=True,
        )
    return _storages[key]


def storage_engines() -> list[Any]:
    """The engines of the storages :func:`study_storage` made in this process."""
    return [storage.engine for storage in _storages.values()]


@dataclass(frozen=True)
class TrialJob:
    """A trial's train job as the search's controller sees it."""

    job_id: int
    trial: int
    status: str
    experiment_version: int | None
    dispatch_count: int
    result: dict[str, Any] | None
    latest_metrics: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


def trial_jobs(factory: sessionmaker[Session], search_job_id: int) -> list[TrialJob]:
    """Every trial job of the search, oldest first."""
    with transaction(factory) as session:
        return [_trial_job(job) for job in _children(session, search_job_id)]


def _children(session: Session, search_job_id: int) -> list[Job]:
    query = select(Job).where(Job.parent_job_id == search_job_id, Job.action == "train")
    return list(session.scalars(query.order_by(Job.id)))


def _trial_job(job: Job) -> TrialJob:
    return TrialJob(
        job_id=job.id,
        trial=int((job.options or {}).get("trial", -1)),
        status=job.status,
        experiment_version=job.experiment_version,
        dispatch_count=job.dispatch_count,
        result=job.result,
        latest_metrics=job.latest_metrics,
    )


def create_trial_job(
    factory: sessionmaker[Session],
    search_job_id: int,
    *,
    trial: int,
    spec: dict[str, Any],
    options: dict[str, Any],
    queue: str,
) -> Job:
    """A queued train job for ``trial`` of the search, on a new version of the search's
    experiment holding ``spec`` (marked as the search's trial version); the existing one
    when the trial already has its job (a controller that restarted between creating it
    and recording the trial)."""
    with transaction(factory) as session:
        search = session.get_one(Job, search_job_id)
        for job in _children(session, search_job_id):
            if (job.options or {}).get("trial") == trial:
                return job
        assert search.experiment_id is not None, "a search has an experiment"
        version = experiments.add_version(
            session, search.experiment_id, spec, search_job_id=search.id
        ).version
        job = job_state.queued_job(
            "train",
            queue=queue,
            options={**options, "trial": trial},
            experiment_id=search.experiment_id,
            experiment_version=version,
            dataset_id=search.dataset_id,
            parent_job_id=search.id,
        )
        session.add(job)
        session.flush()
        return job


def cancel_trials(factory: sessionmaker[Session], search_job_id: int) -> list[int]:
    """Cancel the search's unfinished trials (queued at once, running at its next step);
    returns their ids."""
    now = utcnow()
    with transaction(factory) as session:
        open_jobs = [
            j for j in _children(session, search_job_id) if j.status not in TERMINAL_STATUSES
        ]
        for job in open_jobs:
            for column, value in (job_state.cancel_values(job.status, now) or {}).items():
                setattr(job, column, value)
            job.updated_at = now
        return [job.id for job in open_jobs]


def searches_ahead(factory: sessionmaker[Session], search_job_id: int) -> list[int]:
    """The other searches holding (or about to hold) a controller's worker slot: running,
    cancelling, or queued with their message sent; oldest first."""
    taking = or_(
        Job.status.in_([JobStatus.running, JobStatus.cancelling]),
        (Job.status == JobStatus.queued) & Job.dispatched_at.is_not(None),
    )
    query = select(Job.id).where(Job.action == JobAction.automl, Job.id != search_job_id)
    with transaction(factory) as session:
        return list(session.scalars(query.where(taking).order_by(Job.id)))


def may_send_search(factory: sessionmaker[Session], search_job_id: int, limit: int | None) -> bool:
    """Whether search ``search_job_id``'s controller may be sent now: fewer than ``limit``
    other searches take a slot (``Settings.max_running_searches``; None: always)."""
    return limit is None or len(searches_ahead(factory, search_job_id)) < limit


def must_yield(factory: sessionmaker[Session], search_job_id: int, limit: int | None) -> bool:
    """Whether a running controller must give its slot back: ``limit`` older searches run
    too (two sent at once both started; the younger waits, queued and unsent)."""
    if limit is None:
        return False
    older_running = [job_id for job_id in _running_searches(factory) if job_id < search_job_id]
    return len(older_running) >= limit


def _running_searches(factory: sessionmaker[Session]) -> list[int]:
    running = Job.status.in_([JobStatus.running, JobStatus.cancelling])
    with transaction(factory) as session:
        query = select(Job.id).where(Job.action == JobAction.automl, running)
        return list(session.scalars(query))
