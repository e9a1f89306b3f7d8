"""Engine and session construction for Postgres (production, tests) and SQLite (embedded)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, Result, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

from maskops_core.settings import Settings


def make_engine(settings: Settings) -> Engine:
    """An engine for ``settings.database_url``; Postgres uses ``settings.database_schema``."""
    url = settings.database_url
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if make_url(url).database not in (None, "", ":memory:"):
        # A pool of connections (an in-memory SQLite database has one per thread instead).
        kwargs.update(
            pool_size=settings.database_pool_size,
            max_overflow=settings.database_max_overflow,
            pool_timeout=settings.database_pool_timeout_s,
        )
    if url.startswith("sqlite"):
        # The API, the worker and the reconciler write concurrently from separate processes.
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if settings.database_schema:
        kwargs["connect_args"] = {"options": f"-csearch_path={settings.database_schema}"}
    return create_engine(url, **kwargs)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A short transaction: commit on success, roll back on error, always close."""
    with factory() as session, session.begin():
        yield session


def rowcount(result: Result[Any]) -> int:
    """Rows matched by an UPDATE executed through a Session (a CursorResult at run time)."""
    return cast(CursorResult[Any], result).rowcount
