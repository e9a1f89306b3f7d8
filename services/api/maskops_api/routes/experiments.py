"""``/experiments``: specs as JSON or TAO text, versioned on update, text form on request."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse
from sqlalchemy import func, select

from maskops.spec.models import ExperimentSpec
from maskops_api.deps import (
    ExperimentId,
    FactoryDep,
    IdempotencyKeyDep,
    KeysInFlightDep,
    ReadAccess,
    SessionDep,
    SettingsDep,
    WriteAccess,
)
from maskops_api.errors import ERROR_RESPONSES
from maskops_api.schemas import ExperimentCreate, ExperimentOut, ExperimentUpdate, Page
from maskops_api.services import deletion
from maskops_api.services import experiments as service
from maskops_api.specs import spec_to_text
from maskops_core.db.models import Experiment

router = APIRouter(
    prefix="/experiments",
    tags=["experiments"],
    responses=ERROR_RESPONSES,
)

VersionQuery = Annotated[int | None, Query(ge=1, le=2**31 - 1)]


@router.post("", status_code=201, response_model=ExperimentOut, dependencies=[WriteAccess])
async def create_experiment(
    body: ExperimentCreate,
    settings: SettingsDep,
    factory: FactoryDep,
    keys: KeysInFlightDep,
    idempotency_key: IdempotencyKeyDep = None,
) -> ExperimentOut:
    """A spec as JSON (``spec``) or in TAO's text format (``spec_text``); a bad field comes
    back as 422 with its name (and line, for text)."""

    def work() -> ExperimentOut:
        with factory() as session:
            experiment = service.create_experiment(
                session, settings, body, idempotency_key=idempotency_key
            )
            return service.experiment_out(session, experiment)

    return await keys.run(service.ENDPOINT, idempotency_key, work)


@router.get("", response_model=Page[ExperimentOut], dependencies=[ReadAccess])
def list_experiments(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[ExperimentOut]:
    total = session.scalar(select(func.count(Experiment.id))) or 0
    rows = session.scalars(
        select(Experiment).order_by(Experiment.id.desc()).limit(limit).offset(offset)
    ).all()
    items = [service.experiment_out(session, e) for e in rows]
    return Page(items=items, total=total, limit=limit, offset=offset)


@router.get("/{experiment_id}", response_model=ExperimentOut, dependencies=[ReadAccess])
def get_experiment(
    experiment_id: ExperimentId, session: SessionDep, version: VersionQuery = None
) -> ExperimentOut:
    """Version ``version`` (default: ``latest_version``, the newest version a user made;
    an AutoML trial's version is read by its number, and names its search)."""
    experiment = service.get_experiment(session, experiment_id)
    return service.experiment_out(session, experiment, version)


@router.put("/{experiment_id}", response_model=ExperimentOut, dependencies=[WriteAccess])
def update_experiment(
    experiment_id: ExperimentId, body: ExperimentUpdate, session: SessionDep, settings: SettingsDep
) -> ExperimentOut:
    """A new spec makes a new version (numbered after every version of the experiment,
    AutoML trials' too), the experiment's default from then on; earlier versions stay
    readable (``?version=``)."""
    experiment = service.update_experiment(session, settings, experiment_id, body)
    return service.experiment_out(session, experiment)


@router.delete("/{experiment_id}", status_code=204, dependencies=[WriteAccess])
def delete_experiment(experiment_id: ExperimentId, session: SessionDep) -> None:
    """Delete an experiment and all its spec versions; 409 while jobs use it."""
    deletion.delete_experiment(session, experiment_id)


@router.get(
    "/{experiment_id}/spec.txt",
    response_model=None,
    dependencies=[ReadAccess],
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def get_spec_text(
    experiment_id: ExperimentId, session: SessionDep, version: VersionQuery = None
) -> PlainTextResponse:
    """The spec in TAO's text format (usable with ``maskops train -e``)."""
    experiment = service.get_experiment(session, experiment_id)
    stored = service.get_version(session, experiment, version)
    return PlainTextResponse(spec_to_text(ExperimentSpec.model_validate(stored.spec)))
