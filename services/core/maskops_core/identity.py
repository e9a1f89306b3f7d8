"""Which database a job message belongs to.

Stacks (a database and its workers) may share a broker. ``MASKOPS_STACK_ID`` keeps their
queues apart, but an operator may leave it unset on two stacks that share a Redis
database: both then consume the same queues. Every job message therefore also names the
database that holds its job (a random id given to the database once, never derived from
its address, which differs as seen from each host), and a worker sends a message of
another database back to the broker instead of running or acknowledging it.
"""

from __future__ import annotations

import uuid
import weakref

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from maskops_core.db.models import DatabaseIdentity
from maskops_core.db.session import transaction

_known: weakref.WeakKeyDictionary[sessionmaker[Session], str] = weakref.WeakKeyDictionary()


def database_identity(factory: sessionmaker[Session]) -> str:
    """This database's id (read once per session factory; written on first use where
    the schema came from ``create_all`` rather than the migrations)."""
    if factory not in _known:
        _known[factory] = _read_or_create(factory)
    return _known[factory]


def _read_or_create(factory: sessionmaker[Session]) -> str:
    with transaction(factory) as session:
        row = session.get(DatabaseIdentity, 1)
        if row is not None:
            return row.uuid
    try:
        with transaction(factory) as session:
            session.add(DatabaseIdentity(id=1, uuid=str(uuid.uuid4())))
    except IntegrityError:
        pass  # another process wrote it first
    with transaction(factory) as session:
        row = session.get(DatabaseIdentity, 1)
        assert row is not None
        return row.uuid
