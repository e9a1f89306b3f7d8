"""``/models``: publish an export into the Triton model repository, list, unpublish."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from sqlalchemy import select

from maskops_api.db.models import PublishedModel
from maskops_api.deps import ReadAccess, SessionDep, SettingsDep, WriteAccess
from maskops_api.errors import ERROR_RESPONSES, NotFound
from maskops_api.schemas import ModelOut, PublishedModelOut, PublishRequest
from maskops_api.services import models as service

router = APIRouter(prefix="/models", tags=["models"], responses=ERROR_RESPONSES)

ModelName = Annotated[
    str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Triton model name")
]


@router.get("", response_model=list[ModelOut], dependencies=[ReadAccess])
def list_models(session: SessionDep) -> list[ModelOut]:
    rows = session.scalars(
        select(PublishedModel).order_by(PublishedModel.name, PublishedModel.version)
    )
    return [ModelOut.model_validate(r) for r in rows]


@router.get("/{name}", response_model=list[ModelOut], dependencies=[ReadAccess])
def get_model(name: ModelName, session: SessionDep) -> list[ModelOut]:
    """Every version of ``name``, oldest first."""
    rows = session.scalars(
        select(PublishedModel).where(PublishedModel.name == name).order_by(PublishedModel.version)
    ).all()
    if not rows:
        raise NotFound(f"model {name!r} not found")
    return [ModelOut.model_validate(r) for r in rows]


@router.post(
    "/{name}/publish",
    status_code=201,
    response_model=PublishedModelOut,
    dependencies=[WriteAccess],
)
def publish(
    name: ModelName, body: PublishRequest, session: SessionDep, settings: SettingsDep
) -> PublishedModelOut:
    """Add a succeeded export job's ONNX as the next version of ``name`` and serve it."""
    return service.publish_model(session, settings, name, body.job_id)


@router.post("/{name}/unpublish", response_model=list[ModelOut], dependencies=[WriteAccess])
def unpublish(name: ModelName, session: SessionDep, settings: SettingsDep) -> list[ModelOut]:
    """Stop serving ``name``; its versions stay listed, marked unpublished."""
    return [ModelOut.model_validate(r) for r in service.unpublish_model(session, settings, name)]
