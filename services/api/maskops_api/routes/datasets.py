"""``/datasets``: register a dataset under the data root (queues its conversion), inspect."""

from __future__ import annotations

import contextlib
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from sqlalchemy import func, select

from maskops_api.deps import (
    DatasetId,
    DispatcherDep,
    FactoryDep,
    IdempotencyKeyDep,
    JobCacheDep,
    KeysInFlightDep,
    ReadAccess,
    SessionDep,
    SettingsDep,
    WriteAccess,
)
from maskops_api.errors import ERROR_RESPONSES
from maskops_api.routes import uploads
from maskops_api.schemas import DatasetCreate, DatasetOut, Page
from maskops_api.services import datasets as service
from maskops_api.services import deletion
from maskops_core.db.models import Dataset
from maskops_core.dispatch import dispatch_job
from maskops_core.paths import remove_tree

router = APIRouter(
    prefix="/datasets",
    tags=["datasets"],
    responses=ERROR_RESPONSES,
)


@router.post("", status_code=201, response_model=DatasetOut, dependencies=[WriteAccess])
async def register_dataset(
    body: DatasetCreate,
    settings: SettingsDep,
    factory: FactoryDep,
    dispatcher: DispatcherDep,
    keys: KeysInFlightDep,
    idempotency_key: IdempotencyKeyDep = None,
) -> DatasetOut:
    """Register images + annotations under the data root (COCO JSON, or another labelling
    tool's format, converted to COCO); queues a dataset_convert job. Annotations that are
    not in the declared format are a 422 naming what was expected."""

    def work() -> DatasetOut:
        with factory() as session:
            dataset, job = service.register_dataset(
                session, settings, body, idempotency_key=idempotency_key
            )
            if job is not None:
                dispatch_job(factory, dispatcher, job)
            return service.dataset_out(session, dataset)

    return await keys.run(service.ENDPOINT, idempotency_key, work)


@router.post(
    "/upload",
    status_code=201,
    response_model=DatasetOut,
    dependencies=[WriteAccess],
    responses={413: ERROR_RESPONSES[422] | {"description": "The upload is too large"}},
    openapi_extra={"requestBody": uploads.request_body()},
)
async def upload_dataset(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    factory: FactoryDep,
    dispatcher: DispatcherDep,
) -> DatasetOut:
    """Upload an archive; it is extracted safely under the data root and registered (paths
    inside the archive; the val split is used when its files are present)."""
    # The body is read here, not by FastAPI: its form parser would spool the archive to a
    # temporary file that receive() then copied again.
    folder, form = await uploads.receive(request, settings)
    try:
        body = uploads.dataset_body(
            settings,
            folder,
            name=form.name,
            train=(form.train_image_dir, form.train_annotation_file),
            val=(form.val_image_dir, form.val_annotation_file),
            num_shards=form.num_shards,
            format_name=form.format,
            labels=form.labels,
        )
        dataset, job = await run_in_threadpool(
            service.register_dataset, session, settings, body, idempotency_key=None
        )
    except Exception:
        with contextlib.suppress(OSError):
            remove_tree(folder)
        raise
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


# ":int": "/datasets/upload" is no dataset id, so GET there is a 405 (POST only), not a 422.
@router.get("/{dataset_id:int}", response_model=DatasetOut, dependencies=[ReadAccess])
def get_dataset(dataset_id: DatasetId, session: SessionDep) -> DatasetOut:
    """Counts, label map and conversion warnings once its dataset_convert job is done."""
    return service.dataset_out(session, service.get_dataset(session, dataset_id))


@router.get(
    "/{dataset_id:int}/coco/{split}",
    response_model=None,
    dependencies=[ReadAccess],
    responses={200: {"content": {"application/json": {"schema": {"type": "object"}}}}},
)
def download_coco(
    dataset_id: DatasetId, split: str, session: SessionDep, settings: SettingsDep
) -> FileResponse:
    """The split's annotations as COCO: converted from the dataset's format once its
    dataset_convert job is done (for a COCO dataset, the file it was registered with)."""
    dataset = service.get_dataset(session, dataset_id)
    path = service.coco_file(settings, dataset, split)
    return FileResponse(path, media_type="application/json", filename=f"{split}_coco.json")


@router.delete("/{dataset_id:int}", status_code=204, dependencies=[WriteAccess])
def delete_dataset(
    dataset_id: DatasetId, session: SessionDep, settings: SettingsDep, cache: JobCacheDep
) -> None:
    """Delete a dataset with its shards and conversion jobs (and its extracted upload).
    409 while experiments or other jobs use it, or while it is being converted."""
    for job_id in deletion.delete_dataset(session, settings, dataset_id):
        cache.forget(job_id)
