"""``/automl``: start a hyperparameter search of an experiment, see its trials and best.

A search is an ``automl`` job (``POST /jobs`` with that action does the same); each trial
is a train job whose parent is the search: inspect, cancel or resume it under ``/jobs``.
Cancelling the search cancels its unfinished trials."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from maskops_api.deps import (
    DispatcherDep,
    FactoryDep,
    IdempotencyKeyDep,
    JobId,
    KeysInFlightDep,
    ReadAccess,
    SettingsDep,
    WriteAccess,
)
from maskops_api.errors import ERROR_RESPONSES
from maskops_api.schemas import AutomlCreate, AutomlOut
from maskops_api.services import automl as service
from maskops_api.services import jobs
from maskops_core.dispatch import dispatch_job

router = APIRouter(prefix="/automl", tags=["automl"], responses=ERROR_RESPONSES)


@router.post("", status_code=202, response_model=AutomlOut, dependencies=[WriteAccess])
async def start_search(
    body: AutomlCreate,
    settings: SettingsDep,
    factory: FactoryDep,
    dispatcher: DispatcherDep,
    keys: KeysInFlightDep,
    idempotency_key: IdempotencyKeyDep = None,
) -> AutomlOut:
    """Queue a search; 202 with it (no trials yet). The search space's fields are checked
    against the spec schema: a 422 names the wrong one."""

    def work() -> AutomlOut:
        with factory() as session:
            job, created = jobs.create_job(
                session,
                settings,
                service.search_body(**body.model_dump(exclude_unset=True)),
                idempotency_key=idempotency_key,
                endpoint=service.ENDPOINT,
            )
            if created:
                dispatch_job(factory, dispatcher, job)
            return service.search_view(session, settings, job.id)

    return await keys.run(service.ENDPOINT, idempotency_key, work)


@router.get("/{job_id}", response_model=AutomlOut, dependencies=[ReadAccess])
async def get_search(job_id: JobId, settings: SettingsDep, factory: FactoryDep) -> AutomlOut:
    """The search's job, every trial (parameters, metric, state, its train job), the best
    trial with its spec as TAO text and its checkpoint."""

    def read() -> AutomlOut:
        with factory() as session:
            return service.search_view(session, settings, job_id)

    return await run_in_threadpool(read)
