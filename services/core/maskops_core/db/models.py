"""SQLAlchemy 2.0 typed models. The database is the source of truth for every job.

Changing a model means adding an Alembic migration under ``migrations/versions``.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, Dialect, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps are UTC and always come back timezone-aware (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given; maskops stores UTC-aware timestamps")
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        list[Any]: JSON,
        datetime: UTCDateTime(),
    }


NEVER_REUSE_IDS: dict[str, Any] = {"sqlite_autoincrement": True}
"""Table arguments of every table with an integer id: an id is never given out again after
its row is deleted (a new job must not inherit a deleted job's folder, log or idempotency
keys). Postgres sequences never reuse a value; SQLite needs ``AUTOINCREMENT`` for that."""


class JobStatus(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelling = "cancelling"
    cancelled = "cancelled"


TERMINAL_STATUSES = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})


class TokenScope(enum.StrEnum):
    read = "read"
    write = "write"
    admin = "admin"


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    splits: Mapped[dict[str, Any]]
    """``{"train": {"image_dir": .., "annotation_file": ..}, "val": {..}}``, paths relative
    to the data root; each split is converted into shards tagged with its name."""
    include_masks: Mapped[bool] = mapped_column(default=True)
    num_shards: Mapped[int] = mapped_column(default=8)
    convert_job_id: Mapped[int | None] = mapped_column(default=None)
    shards_dir: Mapped[str | None] = mapped_column(Text, default=None)
    counts: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    label_map: Mapped[list[Any] | None] = mapped_column(default=None)
    warnings: Mapped[list[Any] | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Experiment(Base):
    __tablename__ = "experiments"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    dataset_id: Mapped[int | None] = mapped_column(ForeignKey("datasets.id"), default=None)
    last_version_number: Mapped[int] = mapped_column(default=1)
    """The highest version number given out, to a user's version or an AutoML trial's
    (:func:`maskops_core.experiments.add_version`); which version is the default is
    :func:`maskops_core.experiments.default_version`'s rule."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ExperimentVersion(Base):
    __tablename__ = "experiment_versions"
    __table_args__ = (UniqueConstraint("experiment_id", "version"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    version: Mapped[int]
    spec: Mapped[dict[str, Any]]
    """``ExperimentSpec.model_dump(mode="json")``; the text form is regenerated on request."""
    search_job_id: Mapped[int | None] = mapped_column(default=None)
    """The AutoML search (its ``automl`` job) whose trial this version is; None for a version
    a user made. No foreign key: the mark must outlive a deleted search job, or its trial
    versions would become the experiment's default."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_status_action", "status", "action"),
        Index("ix_jobs_created", "created_at"),
        NEVER_REUSE_IDS,
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    action: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.queued)
    experiment_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id"), default=None)
    experiment_version: Mapped[int | None] = mapped_column(default=None)
    dataset_id: Mapped[int | None] = mapped_column(ForeignKey("datasets.id"), default=None)
    parent_job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), default=None)
    options: Mapped[dict[str, Any]] = mapped_column(default=dict)
    queue: Mapped[str] = mapped_column(String(100))

    attempts: Mapped[int] = mapped_column(default=0)
    """Times a worker claimed the job; a resumed or re-dispatched run increments it."""
    worker_crashes: Mapped[int] = mapped_column(default=0, server_default="0")
    """Times the worker process running the job died under it (a signal such as SIGSEGV, or
    the kernel's OOM killer) while its worker went on (``job_state.worker_crashed``)."""
    dispatch_count: Mapped[int] = mapped_column(default=0)
    dispatched_at: Mapped[datetime | None] = mapped_column(default=None)
    task_id: Mapped[str | None] = mapped_column(String(100), default=None)
    """Celery task id of the latest dispatch (the reconciler looks for it in the broker)."""
    lease_owner: Mapped[str | None] = mapped_column(String(200), default=None)
    """The worker attempt holding the job; only it may report progress or finish it."""
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    worker_id: Mapped[str | None] = mapped_column(String(200), default=None)

    progress_step: Mapped[int | None] = mapped_column(default=None)
    progress_total: Mapped[int | None] = mapped_column(default=None)
    progress_started_step: Mapped[int | None] = mapped_column(default=None)
    progress_started_at: Mapped[datetime | None] = mapped_column(default=None)
    """Step and time of the attempt's first progress report (the ETA's baseline, which
    leaves out model building and data loading)."""
    latest_metrics: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    result: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)

    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    """Start of the current attempt."""
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobMetric(Base):
    __tablename__ = "job_metrics"
    __table_args__ = (Index("ix_job_metrics_job_step", "job_id", "step"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int]
    values: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PublishedModel(Base):
    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("name", "version"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int]
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    """The export job whose artifact was published."""
    published: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    __tablename__ = "api_tokens"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """SHA-256 hex of the token; the token itself is shown once, at creation."""
    scope: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    endpoint: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    resource_id: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WorkerHeartbeat(Base):
    """One row per running worker (its Celery node name), refreshed every heartbeat
    interval: ``/readyz`` reports a queue with work but no live worker. A table rather than
    Celery's remote control, which the SQLite broker of ``maskops serve`` does not carry."""

    __tablename__ = "worker_heartbeats"

    hostname: Mapped[str] = mapped_column(String(200), primary_key=True)
    queues: Mapped[str] = mapped_column(Text)
    """The queues it consumes, comma-separated."""
    pid: Mapped[int]
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    gpus: Mapped[int] = mapped_column(default=0, server_default="0")
    """The GPUs it has (0: CPU only); see :func:`maskops_core.workers.worker_ranks`."""
    cuda: Mapped[str] = mapped_column(Text, default="", server_default="")
    """Its CUDA check at start (``maskops.device``): ``ok: ...``, ``no GPU ...``, ``unusable:
    <why>`` or ``failed: <why>``; empty until the check has run."""
    failing: Mapped[str] = mapped_column(Text, default="", server_default="")
    """Empty, or how its last tasks failed on its database or broker, all in a row (a pool
    process that fails everything it takes): ``/readyz`` reports it."""


class DatabaseIdentity(Base):
    """One row: a random id this database was given once. Job messages name it, so that a
    worker never takes another database's job for one of its own (stacks sharing a broker
    and its queue names, :mod:`maskops_core.identity`)."""

    __tablename__ = "database_identity"

    id: Mapped[int] = mapped_column(primary_key=True)
    """Always 1."""
    uuid: Mapped[str] = mapped_column(String(36))
