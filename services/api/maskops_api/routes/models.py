"""``/models``: publish an export into the Triton model repository, list, unpublish."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from sqlalchemy import select

from maskops_api.deps import (
    DispatcherDep,
    FactoryDep,
    IdempotencyKeyDep,
    KeysInFlightDep,
    ReadAccess,
    SessionDep,
    SettingsDep,
    WriteAccess,
)
from maskops_api.errors import ERROR_RESPONSES, NotFound
from maskops_api.schemas import MODEL_NAME_PATTERN, JobOut, ModelOut, PublishRequest
from maskops_api.services import deletion
from maskops_api.services import models as service
from maskops_api.services.jobs import PUBLISH_ENDPOINT, job_out
from maskops_core.db.models import PublishedModel
from maskops_core.dispatch import dispatch_job

router = APIRouter(prefix="/models", tags=["models"], responses=ERROR_RESPONSES)

ModelName = Annotated[str, Path(pattern=MODEL_NAME_PATTERN, description="Triton model name")]


@router.get("", response_model=list[ModelOut], dependencies=[ReadAccess])
def list_models(session: SessionDep) -> list[ModelOut]:
    rows = session.scalars(
        select(PublishedModel).order_by(PublishedModel.name, PublishedModel.version)
    )
    return [ModelOut.model_validate(r) for r in rows]


@router.get("/{name}", response_model=list[ModelOut], dependencies=[ReadAccess])
def get_model(
    name: ModelName, session: SessionDep, settings: SettingsDep, request: Request
) -> list[ModelOut]:
    """Every version of ``name``, oldest first, with its state on each Triton replica."""
    rows = session.scalars(
        select(PublishedModel).where(PublishedModel.name == name).order_by(PublishedModel.version)
    ).all()
    if not rows:
        raise NotFound(f"model {name!r} not found")
    states = service.replica_states(request.app.state, name) if settings.has_triton else None
    layouts = service.layout_reports(request.app.state, name) if settings.has_triton else None
    versions = []
    for r in rows:
        layout = None if layouts is None or not r.published else layouts(r.version)
        versions.append(
            ModelOut.model_validate(r).model_copy(
                update={
                    "replicas": None if states is None else states(r.version),
                    "network": None if layout is None else layout.network,
                    "instances": None if layout is None else layout.instances,
                }
            )
        )
    return versions


@router.post("/{name}/publish", status_code=202, response_model=JobOut, dependencies=[WriteAccess])
async def publish(
    name: ModelName,
    body: PublishRequest,
    settings: SettingsDep,
    factory: FactoryDep,
    dispatcher: DispatcherDep,
    keys: KeysInFlightDep,
    idempotency_key: IdempotencyKeyDep = None,
) -> JobOut:
    """Queue a publish job: a succeeded export job's graph becomes the next version of
    ``name`` and Triton serves it. 202 with the job; the version shows here once served."""

    def work() -> JobOut:
        with factory() as session:
            job, created = service.publish_model(
                session, settings, name, body.job_id, idempotency_key=idempotency_key
            )
        if created:
            dispatch_job(factory, dispatcher, job)
        return job_out(job)

    return await keys.run(PUBLISH_ENDPOINT.format(name=name), idempotency_key, work)


@router.post("/{name}/unpublish", response_model=list[ModelOut], dependencies=[WriteAccess])
def unpublish(name: ModelName, session: SessionDep, settings: SettingsDep) -> list[ModelOut]:
    """Stop serving ``name``; its versions stay listed, marked unpublished."""
    return [ModelOut.model_validate(r) for r in service.unpublish_model(session, settings, name)]


@router.delete("/{name}", status_code=204, dependencies=[WriteAccess])
def delete_model(name: ModelName, session: SessionDep, settings: SettingsDep) -> None:
    """Delete every version of an unpublished model: its rows and its folders in the model
    repository. 409 while it is published (unpublish it first) or being published."""
    deletion.delete_model(session, settings, name)
