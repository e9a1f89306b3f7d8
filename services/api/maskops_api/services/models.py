"""Publishing exports into the Triton model repository, and taking them out of service."""

from __future__ import annotations

import contextlib

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from maskops_api.db.models import Job, JobAction, JobStatus, PublishedModel
from maskops_api.errors import Conflict, Invalid, NotFound
from maskops_api.schemas import PublishedModelOut
from maskops_api.settings import Settings


def publish_model(
    session: Session, settings: Settings, name: str, job_id: int
) -> PublishedModelOut:
    from maskops.serving import PublishError, publish

    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    if job.action != JobAction.export or job.status != JobStatus.succeeded:
        raise Conflict(f"job {job_id} is a {job.status} {job.action} job, not a succeeded export")
    onnx = settings.data_root / str((job.result or {}).get("onnx", ""))
    if not onnx.is_file():
        raise Conflict(f"export job {job_id} has no ONNX file any more ({onnx.name})")
    try:
        version = publish(
            onnx, settings.model_repository, name, net_backend=settings.triton_net_backend
        )
    except PublishError as exc:
        raise Invalid(f"publish {name!r}: {exc}") from None
    row = PublishedModel(name=name, version=version, job_id=job_id, published=True)
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"model {name!r} version {version} was published concurrently") from None
    served, note = _roll_out(settings, name)
    return PublishedModelOut(
        name=row.name,
        version=row.version,
        job_id=row.job_id,
        published=True,
        created_at=row.created_at,
        served=served,
        note=note,
    )


def _roll_out(settings: Settings, name: str) -> tuple[bool, str]:
    if not settings.triton_url:
        return False, "no Triton configured; the version is in the repository"
    from maskops.serving.client import TritonError, roll_out

    try:
        roll_out(settings.triton_url, name)
    except TritonError as exc:
        return False, f"Triton did not load it: {exc}"
    return True, ""


def unpublish_model(session: Session, settings: Settings, name: str) -> list[PublishedModel]:
    rows = list(session.scalars(select(PublishedModel).where(PublishedModel.name == name)))
    if not rows:
        raise NotFound(f"model {name!r} not found")
    session.execute(
        update(PublishedModel).where(PublishedModel.name == name).values(published=False)
    )
    session.commit()
    if settings.triton_url:
        from maskops.serving.client import TritonError, retire

        # Not loaded (or Triton away): nothing is served either way.
        with contextlib.suppress(TritonError):
            retire(settings.triton_url, name)
    for row in rows:
        session.refresh(row)
    return rows
