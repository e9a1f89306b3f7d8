"""Dataset writes: register a dataset under the data root and queue its conversion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from maskops.path_rules import PathEscape, confine
from maskops_api.errors import Invalid, NotFound
from maskops_api.schemas import DatasetCreate, DatasetOut, DatasetSplit
from maskops_api.services import idempotency
from maskops_core import job_state
from maskops_core.actions import JobAction
from maskops_core.dataset_formats import FOLDER_FORMATS, format_problem
from maskops_core.db.models import Dataset, Job
from maskops_core.settings import Settings

ENDPOINT = "POST /datasets"


def _inside_root(root: Path, relative: str, field: str) -> Path:
    try:
        return confine(root, relative)
    except PathEscape:  # by a symlink inside the data root pointing out of it
        raise Invalid(f"{field}: {relative!r} leaves the data root") from None
    except (OSError, RuntimeError) as exc:  # too long, a symlink loop
        raise Invalid(f"{field}: {relative!r}: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    # str(OSError) names the absolute server path; the client gave (and sees) the path
    # relative to the data root, so only the reason is added.
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return "symlink loop" if isinstance(exc, RuntimeError) else type(exc).__name__


def check_split(
    settings: Settings, split: str, paths: DatasetSplit, format_name: str = "coco"
) -> None:
    image_dir = _inside_root(settings.data_root, paths.image_dir, f"{split}.image_dir")
    annotations = _inside_root(
        settings.data_root, paths.annotation_file, f"{split}.annotation_file"
    )
    # A well-formed path that names nothing is a 404, as an id that names no row is: the
    # request is valid, what it refers to does not exist.
    folder = format_name in FOLDER_FORMATS
    try:
        image_ok = image_dir.is_dir()
        annotations_ok = annotations.exists() if folder else annotations.is_file()
    except OSError as exc:
        raise NotFound(f"{split}: {_reason(exc)}") from None
    if not image_ok:
        raise NotFound(
            f"{split}.image_dir: {paths.image_dir!r} is not a directory under the data root"
        )
    if not annotations_ok:
        raise NotFound(
            f"{split}.annotation_file: {paths.annotation_file!r} is not a "
            f"{'file or folder' if folder else 'file'} under the data root"
        )
    try:
        problem = format_problem(format_name, annotations)
    except OSError as exc:
        raise Invalid(f"{split}.annotation_file: {_reason(exc)}") from None
    if problem is not None:
        raise Invalid(f"{split}.annotation_file: {paths.annotation_file!r}: {problem}")


def register_dataset(
    session: Session, settings: Settings, body: DatasetCreate, *, idempotency_key: str | None
) -> tuple[Dataset, Job | None]:
    """Insert the dataset and its queued dataset_convert job (None when replaying a key)."""
    body_hash = idempotency.request_hash(body.model_dump(mode="json"))
    if idempotency_key:
        existing = idempotency.replayed(
            session, Dataset, key=idempotency_key, endpoint=ENDPOINT, body_hash=body_hash
        )
        if existing is not None:
            return existing, None
    splits = {"train": body.train} | ({"val": body.val} if body.val else {})
    for name, paths in splits.items():
        check_split(settings, name, paths, body.format)
    # The source format travels with each split's paths: the conversion reads it there.
    source: dict[str, Any] = {"format": body.format}
    if body.labels and body.format != "coco":  # a COCO file carries its own ids
        source["labels"] = body.labels
    dataset = Dataset(
        name=body.name,
        splits={name: paths.model_dump() | source for name, paths in splits.items()},
        include_masks=body.include_masks,
        num_shards=body.num_shards,
    )
    session.add(dataset)
    session.flush()
    job = job_state.queued_job(
        JobAction.dataset_convert,
        queue=JobAction.dataset_convert.queue(settings),
        options={},
        dataset_id=dataset.id,
    )
    session.add(job)
    session.flush()
    dataset.convert_job_id = job.id
    winner = idempotency.commit_remembering(
        session,
        key=idempotency_key,
        endpoint=ENDPOINT,
        body_hash=body_hash,
        resource_id=dataset.id,
    )
    if winner is not None:
        return session.get_one(Dataset, winner), None
    return dataset, job


def coco_file(settings: Settings, dataset: Dataset, split: str) -> Path:
    """A split's COCO file: the one converted beside the shards, or the registered one."""
    paths = dataset.splits.get(split)
    if paths is None:
        raise NotFound(f"dataset {dataset.id} has no split {split!r}")
    if paths.get("format", "coco") == "coco":
        path = settings.data_root / paths["annotation_file"]
    elif coco := ((dataset.counts or {}).get(split) or {}).get("coco_file"):
        path = settings.data_root / coco  # where the conversion recorded it
    else:
        raise NotFound(f"dataset {dataset.id} is not converted yet")
    if not path.is_file():
        raise NotFound(f"dataset {dataset.id}: the {split} COCO file is gone")
    return path


def get_dataset(session: Session, dataset_id: int) -> Dataset:
    dataset = session.get(Dataset, dataset_id)
    if dataset is None:
        raise NotFound(f"dataset {dataset_id} not found")
    return dataset


def dataset_out(session: Session, dataset: Dataset) -> DatasetOut:
    job = session.get(Job, dataset.convert_job_id) if dataset.convert_job_id else None
    paths = set(DatasetSplit.model_fields)
    first: dict[str, Any] = next(iter(dataset.splits.values()), {})
    return DatasetOut(
        id=dataset.id,
        name=dataset.name,
        splits={
            k: DatasetSplit.model_validate({f: v[f] for f in paths if f in v})
            for k, v in dataset.splits.items()
        },
        format=first.get("format", "coco"),
        labels=first.get("labels"),
        status=job.status if job else "unknown",
        convert_job_id=dataset.convert_job_id,
        shards_dir=dataset.shards_dir,
        counts=dataset.counts,
        label_map=dataset.label_map,
        warnings=dataset.warnings,
        created_at=dataset.created_at,
    )
