"""``/jobs``: submit, list, inspect, follow logs and metrics, cancel, resume, artifacts."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, PlainTextResponse, StreamingResponse
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from maskops.path_rules import PathEscape, confine
from maskops_api.cache.job_cache import JobCache
from maskops_api.deps import (
    DispatcherDep,
    FactoryDep,
    IdempotencyKeyDep,
    JobCacheDep,
    JobId,
    KeysInFlightDep,
    ReadAccess,
    SessionDep,
    SettingsDep,
    WriteAccess,
)
from maskops_api.errors import ERROR_RESPONSES, NotFound
from maskops_api.schemas import Artifact, ErrorOut, JobCreate, JobOut, MetricPoint, Page
from maskops_api.services import deletion
from maskops_api.services import jobs as service
from maskops_api.streams import Slot, StreamSlots
from maskops_core.actions import JobAction
from maskops_core.db.models import TERMINAL_STATUSES, Job, JobMetric, JobStatus
from maskops_core.dispatch import dispatch_job

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/jobs",
    tags=["jobs"],
    responses=ERROR_RESPONSES,
)

LOG_FILE = "job.log"
FOLLOW_INTERVAL_S = 0.5
"""How often a log stream looks for new lines and for the job's end."""
MAX_LOG_OFFSET = 2**40
"""The largest ``offset`` accepted (1 TiB, beyond any job's log); an offset past the end
of the log reads nothing rather than seeking beyond what the filesystem allows."""


@router.post("", status_code=202, response_model=JobOut, dependencies=[WriteAccess])
async def submit_job(
    body: JobCreate,
    settings: SettingsDep,
    factory: FactoryDep,
    dispatcher: DispatcherDep,
    keys: KeysInFlightDep,
    idempotency_key: IdempotencyKeyDep = None,
) -> JobOut:
    """Queue a job; 202 with the job. Retrying with the same ``Idempotency-Key`` is safe,
    concurrently too: the retries wait for the first request and answer its job."""

    def work() -> JobOut:
        # The session is closed before the answer is rendered: no connection is held
        # while the response waits for its turn.
        with factory() as session:
            job, created = service.create_job(
                session, settings, body, idempotency_key=idempotency_key
            )
        if created:
            dispatch_job(factory, dispatcher, job)
        return service.job_out(job)

    return await keys.run(service.ENDPOINT, idempotency_key, work)


@router.get("", response_model=Page[JobOut], dependencies=[ReadAccess])
def list_jobs(
    session: SessionDep,
    status: JobStatus | None = None,
    action: JobAction | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[JobOut]:
    """Newest first."""
    query = select(Job)
    if status is not None:
        query = query.where(Job.status == status)
    if action is not None:
        query = query.where(Job.action == action)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Job.id.desc()).limit(limit).offset(offset)).all()
    return Page(items=[service.job_out(j) for j in rows], total=total, limit=limit, offset=offset)


@router.get("/{job_id}", response_model=JobOut, dependencies=[ReadAccess])
async def get_job(job_id: JobId, cache: JobCacheDep) -> Response:
    """Status, progress (step, total, ETA), latest metrics, error."""
    # Status polls are the hottest route. A job in memory is answered before this route
    # (status_shortcut) unless auth is on; here it is served from memory too, or read in
    # one trip to the threadpool; either way as JSON rendered once (returning the model
    # would make FastAPI validate and serialise it again).
    return Response(await cache.fetch_body(job_id), media_type="application/json")


@router.delete("/{job_id}", status_code=204, dependencies=[WriteAccess])
def delete_job(
    job_id: JobId, session: SessionDep, settings: SettingsDep, cache: JobCacheDep
) -> None:
    """Delete a finished job with its artifacts. 409 while it is queued, running or
    cancelling (cancel it first), or while a job, model or dataset still refers to it."""
    deletion.delete_job(session, settings, job_id)
    cache.forget(job_id)


@router.post("/{job_id}/cancel", response_model=JobOut, dependencies=[WriteAccess])
def cancel_job(job_id: JobId, session: SessionDep, cache: JobCacheDep) -> JobOut:
    """A queued job is cancelled at once; a running job stops at its next step and keeps its
    last checkpoint (status ``cancelling`` until it has)."""
    job = service.cancel_job(session, job_id)
    cache.forget(job_id)
    return service.job_out(job)


@router.post("/{job_id}/resume", status_code=202, response_model=JobOut, dependencies=[WriteAccess])
def resume_job(
    job_id: JobId,
    session: SessionDep,
    factory: FactoryDep,
    dispatcher: DispatcherDep,
    cache: JobCacheDep,
) -> JobOut:
    """Queue a failed or cancelled training job again; it continues from its checkpoint."""
    job = service.resume_job(session, job_id)
    cache.forget(job_id)
    dispatch_job(factory, dispatcher, job)
    return service.job_out(job)


@router.get("/{job_id}/metrics", response_model=list[MetricPoint], dependencies=[ReadAccess])
def job_metrics(
    job_id: JobId,
    session: SessionDep,
    since_step: Annotated[int, Query(ge=-1, le=2**31 - 1)] = -1,
) -> list[MetricPoint]:
    """The metric time series (losses, learning rate, AP...), oldest first."""
    service.get_job(session, job_id)
    rows = session.scalars(
        select(JobMetric)
        .where(JobMetric.job_id == job_id, JobMetric.step > since_step)
        .order_by(JobMetric.id)
    ).all()
    return [MetricPoint(step=r.step, time=r.created_at, values=r.values) for r in rows]


@router.get(
    "/{job_id}/logs",
    response_model=None,
    dependencies=[ReadAccess],
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        429: {"model": ErrorOut, "description": "MASKOPS_MAX_LOG_FOLLOWERS streams are open"},
    },
)
async def job_logs(
    job_id: JobId,
    request: Request,
    settings: SettingsDep,
    cache: JobCacheDep,
    offset: Annotated[int, Query(ge=0, le=MAX_LOG_OFFSET)] = 0,
    follow: bool = False,
) -> Response:
    """The job's log from byte ``offset``; ``follow=true`` streams until the job ends (at
    most ``MASKOPS_MAX_LOG_FOLLOWERS`` streams at once: 429 beyond)."""
    await cache.fetch_status(job_id)  # 404 for an unknown job
    path = settings.jobs_dir / str(job_id) / LOG_FILE
    if not follow:
        return PlainTextResponse(await run_in_threadpool(_read_from, path, offset))
    slots: StreamSlots = request.app.state.log_followers
    return StreamingResponse(
        _tail(path, offset, job_id, cache, slots.take()), media_type="text/plain"
    )


async def _tail(
    path: Path, offset: int, job_id: int, cache: JobCache, slot: Slot
) -> AsyncIterator[bytes]:
    """The log from ``offset`` as it grows, until the job has ended. No database connection
    is held between checks: the job's status comes from the job cache (memory on Postgres,
    one short read on SQLite)."""
    position = offset
    try:
        while True:
            chunk = (await run_in_threadpool(_read_from, path, position)).encode()
            position += len(chunk)
            if chunk:
                yield chunk
            if await _ended(cache, job_id):
                rest = (await run_in_threadpool(_read_from, path, position)).encode()
                if rest:
                    yield rest
                return
            await asyncio.sleep(FOLLOW_INTERVAL_S)
    finally:
        slot.release()


async def _ended(cache: JobCache, job_id: int) -> bool:
    """Whether the job has ended (or was deleted); False when the check could not be made
    (the database busy or away: the next check decides)."""
    try:
        return await cache.fetch_status(job_id) in TERMINAL_STATUSES
    except NotFound:
        return True
    except SQLAlchemyError as exc:
        log.info("job %s: log follower's check skipped (%s)", job_id, exc)
        return False


def _read_from(path: Path, offset: int) -> str:
    if not path.is_file():
        return ""
    with path.open("rb") as f:
        # Bounded by the file's size: some filesystems refuse to seek far past the end
        # (EINVAL), and past the end there is nothing to read anyway.
        f.seek(min(offset, os.fstat(f.fileno()).st_size))
        return f.read().decode("utf-8", errors="replace")


@router.get("/{job_id}/artifacts", response_model=list[Artifact], dependencies=[ReadAccess])
def list_artifacts(job_id: JobId, session: SessionDep, settings: SettingsDep) -> list[Artifact]:
    """Files the job wrote: checkpoints, exported models, reports, images, logs."""
    service.get_job(session, job_id)
    root = settings.jobs_dir / str(job_id)
    if not root.is_dir():
        return []
    return [
        Artifact(path=p.relative_to(root).as_posix(), size=p.stat().st_size)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    ]


@router.get(
    "/{job_id}/artifacts/{path:path}",
    response_model=None,
    dependencies=[ReadAccess],
    responses={
        200: {
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            }
        }
    },
)
def download_artifact(
    job_id: JobId, path: str, session: SessionDep, settings: SettingsDep
) -> FileResponse:
    service.get_job(session, job_id)
    try:
        target = confine(settings.jobs_dir / str(job_id), path)
    except (PathEscape, OSError, RuntimeError):  # leaves the job's folder, a link loop
        raise NotFound(f"job {job_id} has no artifact {path!r}") from None
    if not target.is_file():
        raise NotFound(f"job {job_id} has no artifact {path!r}")
    return FileResponse(target, filename=target.name)
