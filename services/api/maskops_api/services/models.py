"""Publishing exports into the Triton model repository (a job), and taking them out of
service (synchronous: it only flips rows and asks Triton to unload)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from starlette.datastructures import State

from maskops_api.errors import NotFound
from maskops_api.schemas import JobCreate
from maskops_api.services.jobs import PUBLISH_ENDPOINT, create_job
from maskops_api.serving.replicas import replica_pool
from maskops_core.actions import JobAction
from maskops_core.db.models import Job, PublishedModel
from maskops_core.settings import ReplicaLookupError, Settings

if TYPE_CHECKING:
    from maskops.serving.client import ServedLayout


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
        endpoint=PUBLISH_ENDPOINT.format(name=name),
    )


def unpublish_model(session: Session, settings: Settings, name: str) -> list[PublishedModel]:
    rows = list(session.scalars(select(PublishedModel).where(PublishedModel.name == name)))
    if not rows:
        raise NotFound(f"model {name!r} not found")
    session.execute(
        update(PublishedModel).where(PublishedModel.name == name).values(published=False)
    )
    session.commit()
    if settings.has_triton:
        from maskops.serving.replicas import retire_all

        # A replica where it is not loaded (or that is away) serves nothing either way.
        with contextlib.suppress(ReplicaLookupError):
            retire_all(settings.triton_replicas(), name)
    for row in rows:
        session.refresh(row)
    return rows


def replica_states(state: State, name: str) -> Callable[[int], dict[str, str]]:
    """Ask every Triton replica about ``name`` once; the returned function gives one
    version's state per replica."""
    from maskops.serving.client import TritonUnavailable
    from maskops.serving.replicas import states_all

    try:
        urls = replica_pool(state).replicas()
    except TritonUnavailable as exc:
        asked: dict[str, dict[str, str] | str] = {"MASKOPS_TRITON_DNS": str(exc)}
    else:
        asked = states_all(urls, name)

    def of(version: int) -> dict[str, str]:
        return {
            url: states if isinstance(states, str) else states.get(str(version), "not loaded")
            for url, states in asked.items()
        }

    return of


def layout_reports(state: State, name: str) -> Callable[[int], ServedLayout | None]:
    """Where each version's network runs and how many instances of each of its models
    run, as their configs on the first replica that answers say; None for a version that
    is not loaded there."""
    from maskops.serving.client import TritonError, TritonUnavailable, served_layout

    try:
        urls = replica_pool(state).replicas()
    except TritonUnavailable:
        urls = []

    def of(version: int) -> ServedLayout | None:
        for url in urls:
            try:
                return served_layout(url, name, version=str(version), timeout_s=5.0)
            except TritonUnavailable:
                continue  # another replica may answer
            except TritonError:
                return None
        return None

    return of
