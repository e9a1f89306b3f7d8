"""Job rows and their state: the one place new job rows are made (:func:`queued_job`), the
cancel rule (:func:`cancel_values`), and the transitions a worker makes, each one short
transaction.

Every write after the claim is conditional on the worker still holding the job's lease
(``lease_owner``): a worker whose job was taken over after a heartbeat timeout can no longer
report progress or finish it, so one job never has two writers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from maskops_core.db.models import (
    Dataset,
    ExperimentVersion,
    Job,
    JobMetric,
    JobStatus,
    PublishedModel,
    utcnow,
)
from maskops_core.db.session import rowcount, transaction


@dataclass(frozen=True)
class JobSnapshot:
    """What a worker needs to know about its job, read once at claim time."""

    id: int
    action: str
    attempts: int
    options: dict[str, Any]
    spec: dict[str, Any] | None
    """The experiment version's spec (JSON form), if the job has an experiment."""
    dataset_id: int | None
    dataset_splits: dict[str, Any] | None
    dataset_shards_dir: str | None
    dataset_include_masks: bool
    dataset_num_shards: int
    parent_job_id: int | None
    parent_action: str | None
    parent_result: dict[str, Any] | None


@dataclass(frozen=True)
class Heartbeat:
    lease_lost: bool
    cancel_requested: bool


def queued_job(
    action: str,
    *,
    queue: str,
    options: dict[str, Any],
    experiment_id: int | None = None,
    experiment_version: int | None = None,
    dataset_id: int | None = None,
    parent_job_id: int | None = None,
) -> Job:
    """A new job row of ``action``, queued on ``queue``, not yet added to a session: every
    job (a POST /jobs, a dataset's conversion, a search's trial) starts as this."""
    return Job(
        action=action,
        status=JobStatus.queued,
        experiment_id=experiment_id,
        experiment_version=experiment_version,
        dataset_id=dataset_id,
        parent_job_id=parent_job_id,
        options=options,
        queue=queue,
    )


def cancel_values(status: str, now: datetime) -> dict[str, Any] | None:
    """The columns a cancel request sets on a job in ``status``: a queued job is cancelled
    at once; a running one becomes cancelling (its action stops at its next step, and
    :func:`finish` makes it cancelled). None where a cancel changes nothing: the job is
    cancelling already, or finished."""
    if status == JobStatus.queued:
        return {"status": JobStatus.cancelled, "finished_at": now, "updated_at": now}
    if status == JobStatus.running:
        return {"status": JobStatus.cancelling, "updated_at": now}
    return None


def claim(
    factory: sessionmaker[Session], job_id: int, *, owner: str, worker_id: str
) -> JobSnapshot | None:
    """Take a queued job (``None`` if it is not queued: running elsewhere, done, cancelled)."""
    now = utcnow()
    with transaction(factory) as session:
        claimed = rowcount(
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == JobStatus.queued)
                .values(
                    status=JobStatus.running,
                    lease_owner=owner,
                    worker_id=worker_id,
                    heartbeat_at=now,
                    started_at=now,
                    updated_at=now,
                    attempts=Job.attempts + 1,
                    error=None,
                    # ETA is measured over the current attempt only.
                    progress_started_step=None,
                )
            )
        )
        if claimed != 1:
            return None
        return _snapshot(session, session.get_one(Job, job_id))


def running_snapshot(factory: sessionmaker[Session], job_id: int) -> JobSnapshot | None:
    """The job as :func:`claim` returns it, without claiming it, while it runs (the other
    nodes of a multi-node job read it so); None once it is not running."""
    with transaction(factory) as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.running:
            return None
        return _snapshot(session, job)


def _snapshot(session: Session, job: Job) -> JobSnapshot:
    """What a worker reads of ``job`` (its spec, dataset and parent)."""
    spec = None
    if job.experiment_id is not None:
        spec = session.scalars(
            select(ExperimentVersion.spec).where(
                ExperimentVersion.experiment_id == job.experiment_id,
                ExperimentVersion.version == job.experiment_version,
            )
        ).one()
    dataset = session.get(Dataset, job.dataset_id) if job.dataset_id is not None else None
    parent = session.get(Job, job.parent_job_id) if job.parent_job_id is not None else None
    return JobSnapshot(
        id=job.id,
        action=job.action,
        attempts=job.attempts,
        options=dict(job.options or {}),
        spec=spec,
        dataset_id=job.dataset_id,
        dataset_splits=dataset.splits if dataset else None,
        dataset_shards_dir=dataset.shards_dir if dataset else None,
        dataset_include_masks=dataset.include_masks if dataset else True,
        dataset_num_shards=dataset.num_shards if dataset else 1,
        parent_job_id=job.parent_job_id,
        parent_action=parent.action if parent else None,
        parent_result=parent.result if parent else None,
    )


def heartbeat(factory: sessionmaker[Session], job_id: int, *, owner: str) -> Heartbeat:
    now = utcnow()
    with transaction(factory) as session:
        kept = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.lease_owner == owner)
            .values(heartbeat_at=now)
            .returning(Job.status)
        ).scalar_one_or_none()
    return Heartbeat(lease_lost=kept is None, cancel_requested=kept == JobStatus.cancelling)


def report_progress(
    factory: sessionmaker[Session],
    job_id: int,
    *,
    owner: str,
    step: int,
    total: int | None,
    metrics: dict[str, float] | None = None,
) -> bool:
    """Record progress (and a metrics point); False if the lease was lost."""
    now = utcnow()
    values: dict[str, Any] = {"progress_step": step, "heartbeat_at": now, "updated_at": now}
    if total is not None:
        values["progress_total"] = total
    with transaction(factory) as session:
        job = session.scalars(
            select(Job).where(Job.id == job_id, Job.lease_owner == owner).with_for_update()
        ).one_or_none()
        if job is None:
            return False
        if job.progress_started_step is None:
            values["progress_started_step"] = step
            values["progress_started_at"] = now
        if metrics:
            values["latest_metrics"] = {**(job.latest_metrics or {}), **metrics}
            session.add(JobMetric(job_id=job_id, step=step, values=metrics, created_at=now))
        session.execute(update(Job).where(Job.id == job_id).values(**values))
    return True


def finish(
    factory: sessionmaker[Session],
    job_id: int,
    *,
    owner: str,
    status: JobStatus,
    error: str | None = None,
    result: dict[str, Any] | None = None,
) -> bool:
    """Move the job to a terminal state; a pending cancel wins over success."""
    now = utcnow()
    with transaction(factory) as session:
        current = session.scalars(
            select(Job.status).where(Job.id == job_id, Job.lease_owner == owner).with_for_update()
        ).one_or_none()
        if current is None:
            return False
        if current == JobStatus.cancelling and status == JobStatus.succeeded:
            status = JobStatus.cancelled
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                status=status,
                error=error,
                result=result,
                lease_owner=None,
                finished_at=now,
                updated_at=now,
            )
        )
    return True


def requeue(factory: sessionmaker[Session], job_id: int, *, owner: str, reason: str) -> bool:
    """Put a running job back in the queue with ``reason`` as its error until the next
    claim (the reconciler sends it again); False if the lease was lost."""
    now = utcnow()
    with transaction(factory) as session:
        kept = rowcount(
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.lease_owner == owner)
                .where(Job.status == JobStatus.running)
                .values(
                    status=JobStatus.queued,
                    error=reason,
                    lease_owner=None,
                    dispatched_at=None,
                    updated_at=now,
                )
            )
        )
    return kept == 1


MAX_WORKER_CRASHES = 2
"""A job whose worker process died this many times while running it fails instead of being
sent again: a job that crashes its process (a segfault in native code, the kernel's OOM
killer) would otherwise crash every worker it is sent to."""
_LOG_TAIL_BYTES = 8192


def worker_crashed(
    factory: sessionmaker[Session], job_id: int, *, owner_prefix: str, why: str, data_root: Path
) -> str | None:
    """Record that the worker process holding job ``job_id`` (its lease owner starts with
    ``owner_prefix``, ``"<host>:<pid>:"``) died running it, ``why`` saying how (``signal 11
    (SIGSEGV)``). The job goes back to queued for another attempt, or fails once it has
    killed :data:`MAX_WORKER_CRASHES` processes (a cancelling job is cancelled); the error
    says what it was doing (:func:`what_it_was_doing`). Returns the new status; None when
    that process held no running attempt of the job (another worker took it over)."""
    now = utcnow()
    with transaction(factory) as session:
        job = session.scalars(
            select(Job)
            .where(Job.id == job_id, Job.status.in_([JobStatus.running, JobStatus.cancelling]))
            .where(Job.lease_owner.startswith(owner_prefix, autoescape=True))
            .with_for_update()
        ).one_or_none()
        if job is None:
            return None
        crashes = job.worker_crashes + 1
        doing = what_it_was_doing(data_root, job_id, job.progress_step, job.progress_total)
        values: dict[str, Any] = {"worker_crashes": crashes, "lease_owner": None, "updated_at": now}
        if job.status == JobStatus.cancelling:
            values.update(status=JobStatus.cancelled, finished_at=now)
        elif crashes >= MAX_WORKER_CRASHES:
            error = f"the worker process died {crashes} times running this job ({why}), "
            values.update(status=JobStatus.failed, finished_at=now, error=error + doing)
        else:
            error = f"the worker process died ({why}), {doing}; sent again"
            values.update(status=JobStatus.queued, error=error)
        session.execute(update(Job).where(Job.id == job_id).values(**values))
        return str(values["status"])


def what_it_was_doing(data_root: Path, job_id: int, step: int | None, total: int | None) -> str:
    """What a job was doing, for an error that ends it from outside: the last line of its
    log (``<data root>/jobs/<id>/job.log``) and its progress, as ``at 'line', progress
    3/10``."""
    line = ""
    try:
        with (job_dir(data_root, job_id) / "job.log").open("rb") as log:
            size = log.seek(0, 2)
            log.seek(max(0, size - _LOG_TAIL_BYTES))
            lines = log.read().decode("utf-8", "replace").splitlines()
        line = next((x.strip() for x in reversed(lines) if x.strip()), "")
    except OSError:
        pass
    progress = f"progress {step}/{total}" if step is not None else "no progress reported"
    return f"at {line!r}, {progress}" if line else f"at {progress}"


def job_dir(data_root: Path, job_id: int) -> Path:
    return data_root / "jobs" / str(job_id)


def record_dataset(
    factory: sessionmaker[Session],
    dataset_id: int,
    *,
    shards_dir: str,
    counts: dict[str, Any],
    label_map: list[Any],
    warnings: list[Any],
) -> None:
    with transaction(factory) as session:
        session.execute(
            update(Dataset)
            .where(Dataset.id == dataset_id)
            .values(shards_dir=shards_dir, counts=counts, label_map=label_map, warnings=warnings)
        )


def record_published_model(
    factory: sessionmaker[Session], *, name: str, version: int, export_job_id: int
) -> None:
    """List version ``version`` of ``name`` (an export job's graph) as published."""
    with transaction(factory) as session:
        session.add(
            PublishedModel(name=name, version=version, job_id=export_job_id, published=True)
        )
