"""Publishing exports into the Triton model repository (a job), and taking them out of
service (synchronous: it only flips rows and asks Triton to unload)."""

from __future__ import annotations

import contextlib

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from maskops_api.errors import NotFound
from maskops_api.schemas import JobCreate
from maskops_api.services.jobs import create_job
from maskops_core.actions import JobAction
from maskops_core.db.models import Job, PublishedModel
from maskops_core.settings import Settings


def publish_model(
    session: Session, settings: Settings, name: str, job_id: int, *, idempotency_key: str | None
) -> tuple[Job, bool]:
    """Queue a publish job for export job ``job_id`` as the next version of ``name``.

    The worker writes the repository and rolls the version out; ``GET /models/{name}``
    lists the version once Triton serves it.
    """
    body = JobCreate(action=JobAction.publish, parent_job_id=job_id, options={"name": name})
    return create_job(
        session,
        settings,
        body,
        idempotency_key=idempotency_key,
        endpoint=f"POST /models/{name}/publish",
    )


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
