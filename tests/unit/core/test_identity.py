"""A database's identity: given once, the same for every process that reads it, and
different for another database."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from maskops_core.db.models import DatabaseIdentity
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.identity import database_identity
from maskops_core.settings import Settings
from tests.support.control_plane import make_settings


def test_the_identity_is_stable_and_shared_by_every_reader(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    first = database_identity(factory)
    assert first == database_identity(factory)
    other_reader = make_engine(settings)  # another process's view of the same database
    try:
        assert database_identity(make_session_factory(other_reader)) == first
    finally:
        other_reader.dispose()


def test_another_database_has_another_identity(
    tmp_path: Path, factory: sessionmaker[Session]
) -> None:
    engine = make_engine(make_settings(tmp_path / "other"))
    try:
        assert database_identity(make_session_factory(engine)) != database_identity(factory)
    finally:
        engine.dispose()


def test_readers_racing_to_give_the_first_identity_agree(
    settings: Settings, factory: sessionmaker[Session]
) -> None:
    # A schema made by create_all has no identity row: the first readers write it.
    with factory() as session, session.begin():
        session.execute(delete(DatabaseIdentity))
    engines = [make_engine(settings) for _ in range(4)]
    seen: list[str] = []
    threads = [
        threading.Thread(target=lambda e=e: seen.append(database_identity(make_session_factory(e))))
        for e in engines
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for engine in engines:
        engine.dispose()
    assert len(seen) == 4 and len(set(seen)) == 1
    with factory() as session:
        assert session.query(DatabaseIdentity).count() == 1
