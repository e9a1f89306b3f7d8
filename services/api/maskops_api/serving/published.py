"""Triton serves what is published, and only that.

Triton runs in explicit model-control mode and loads nothing by itself: the repository also
holds versions that were unpublished or never finished. After Triton (re)starts, every
published model must be loaded again; :func:`serve_published` does it, from ``maskops
serve``'s supervisor once its Triton is up, and from the reconciler on every pass, which is
how a restarted Triton container (any of the replicas) is brought back in production.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from maskops_core.db.models import PublishedModel
from maskops_core.settings import Settings


@dataclass
class Served:
    """What one pass did: models it loaded, and those Triton would not load (with why)."""

    loaded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def published_names(factory: sessionmaker[Session]) -> list[str]:
    with factory() as session:
        query = select(PublishedModel.name).where(PublishedModel.published).distinct()
        return sorted(session.scalars(query))


def serve_published(factory: sessionmaker[Session], triton_url: str) -> Served:
    """Load every published model Triton does not serve; ready ones are left alone."""
    from maskops.serving.client import TritonError, is_ready, roll_out

    served = Served()
    for name in published_names(factory):
        if is_ready(triton_url, name):
            continue
        try:
            roll_out(triton_url, name)
        except TritonError as exc:
            served.failed.append(f"{name} ({exc})")
        else:
            served.loaded.append(name)
    return served


def serve_published_on_replicas(
    factory: sessionmaker[Session], settings: Settings
) -> dict[str, Served]:
    """:func:`serve_published` on every Triton replica.

    Raises:
        maskops_core.settings.ReplicaLookupError: ``MASKOPS_TRITON_DNS`` does not resolve.
    """
    return {url: serve_published(factory, url) for url in settings.triton_replicas()}
