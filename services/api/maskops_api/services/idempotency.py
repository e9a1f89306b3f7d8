"""``Idempotency-Key``: a retried POST returns the resource the first request created.

The key row is inserted in the same transaction as the resource, so two concurrent retries
cannot both create one: the second commit violates the key's primary key and returns the
first request's resource instead. Deleting a resource deletes the keys that created it
(:mod:`maskops_api.services.deletion`); a key whose resource is gone anyway (deleted before
that rule) is forgotten when it is next used, and the request creates a new resource.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypeVar

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from maskops_api.errors import Conflict
from maskops_core.db.models import IdempotencyKey

T = TypeVar("T")


def request_hash(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def lookup(session: Session, *, key: str, endpoint: str, body_hash: str) -> int | None:
    """The resource id an earlier request with this key created, or None."""
    row = session.scalars(
        select(IdempotencyKey).where(IdempotencyKey.key == key, IdempotencyKey.endpoint == endpoint)
    ).one_or_none()
    if row is None:
        return None
    if row.request_hash != body_hash:
        raise Conflict(f"Idempotency-Key {key!r} was already used with a different request body")
    return row.resource_id


def replayed(
    session: Session, model: type[T], *, key: str, endpoint: str, body_hash: str
) -> T | None:
    """The ``model`` row an earlier request with this key created, or None (never used, or
    its resource is gone: the key is then forgotten, in this transaction)."""
    resource_id = lookup(session, key=key, endpoint=endpoint, body_hash=body_hash)
    if resource_id is None:
        return None
    resource = session.get(model, resource_id)
    if resource is None:
        session.execute(
            delete(IdempotencyKey).where(
                IdempotencyKey.key == key, IdempotencyKey.endpoint == endpoint
            )
        )
    return resource


def remember(
    session: Session, *, key: str, endpoint: str, body_hash: str, resource_id: int
) -> None:
    session.add(
        IdempotencyKey(key=key, endpoint=endpoint, request_hash=body_hash, resource_id=resource_id)
    )


def commit_remembering(
    session: Session, *, key: str | None, endpoint: str, body_hash: str, resource_id: int
) -> int | None:
    """Commit a newly created resource, recording ``key`` for it in the same transaction.

    Returns None once committed, or, when a concurrent request with the same key won the
    race (the key's primary key is violated), the id of the resource that request created;
    the session is then rolled back. Any other integrity error propagates.
    """
    if key:
        remember(session, key=key, endpoint=endpoint, body_hash=body_hash, resource_id=resource_id)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = lookup(session, key=key, endpoint=endpoint, body_hash=body_hash) if key else None
        if existing is None:
            raise
        return existing
    return None
