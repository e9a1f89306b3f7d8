"""``/datasets``: register a dataset under the data root (queues its conversion), inspect."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import func, select

from maskops_api.db.models import Dataset
from maskops_api.deps import (
    DatasetId,
    DispatcherDep,
    FactoryDep,
    IdempotencyKeyDep,
    ReadAccess,
    SessionDep,
    SettingsDep,
    WriteAccess,
)
from maskops_api.dispatch import dispatch_job
from maskops_api.errors import ERROR_RESPONSES
from maskops_api.schemas import DatasetCreate, DatasetOut, Page
from maskops_api.services import datasets as service

router = APIRouter(
    prefix="/datasets",
    tags=["datasets"],
    responses=ERROR_RESPONSES,
)


@router.post("", status_code=201, response_model=DatasetOut, dependencies=[WriteAccess])
def register_dataset(
    body: DatasetCreate,
    session: SessionDep,
    settings: SettingsDep,
    factory: FactoryDep,
    dispatcher: DispatcherDep,
    idempotency_key: IdempotencyKeyDep = None,
) -> DatasetOut:
    """Register images + COCO JSON under the data root; queues a dataset_convert job."""
    dataset, job = service.register_dataset(
        session, settings, body, idempotency_key=idempotency_key
    )
    if job is not None:
        dispatch_job(factory, dispatcher, job)
    return service.dataset_out(session, dataset)


@router.get("", response_model=Page[DatasetOut], dependencies=[ReadAccess])
def list_datasets(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[DatasetOut]:
    total = session.scalar(select(func.count(Dataset.id))) or 0
    rows = session.scalars(select(Dataset).order_by(Dataset.id.desc()).limit(limit).offset(offset))
    items = [service.dataset_out(session, d) for d in rows.all()]
    return Page(items=items, total=total, limit=limit, offset=offset)


@router.get("/{dataset_id}", response_model=DatasetOut, dependencies=[ReadAccess])
def get_dataset(dataset_id: DatasetId, session: SessionDep) -> DatasetOut:
    """Counts, label map and conversion warnings once its dataset_convert job is done."""
    return service.dataset_out(session, service.get_dataset(session, dataset_id))
