"""The worker's pool processes are forked from its main process: what they may inherit.

SQLite keeps a process's locks on a database file in memory that every connection of that
process to the file shares. A pool process forked while a thread of the main process held
a write transaction inherits that memory with the lock marked held, by a connection that
no longer runs: each write of the new process waits out the busy timeout and fails with
"database is locked", for the life of the process (one replacement process failed every
task for 8.5 minutes so). Hence:

- the main process's own transactions (its heartbeat thread) run under
  :data:`FORK_GUARD`, and a fork waits until none is open (``os.register_at_fork``);
- a new pool process drops the engines it inherited without closing their connections,
  which belong to its parent (SQLAlchemy's rule for an engine across a fork:
  ``engine.dispose(close=False)``);
- a new pool process checks that it can write each SQLite database it uses (the
  control-plane database, a SQLite broker, whose transactions Celery's main thread runs
  outside the guard) and exits at once if not: the pool forks a fresh one.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, make_url

from maskops_core.settings import Settings

log = logging.getLogger(__name__)

FORK_WAIT_S = 60.0
"""Longest a fork waits for open transactions (a stuck one must not stop the pool)."""
WRITE_CHECK_TIMEOUT_S = 10.0
"""How long a new pool process waits for a database's write lock before it takes the
database for unusable (other processes hold it for milliseconds)."""
UNUSABLE_EXIT_CODE = 75
"""A pool process that cannot write its databases exits with this (EX_TEMPFAIL)."""


class ForkGuard:
    """Transactions of any thread hold it shared; a fork holds it alone."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._open = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        """No fork happens while this block runs."""
        with self._cond:
            self._open += 1
        try:
            yield
        finally:
            with self._cond:
                self._open -= 1
                self._cond.notify_all()

    def before_fork(self) -> None:
        # Kept locked through the fork: no transaction opens meanwhile.
        self._cond.acquire()
        self._cond.wait_for(lambda: self._open == 0, timeout=FORK_WAIT_S)

    def after_fork_in_parent(self) -> None:
        self._cond.release()

    def after_fork_in_child(self) -> None:
        # The child's only thread forked: the lock it holds is this thread's; no
        # transaction of the parent's other threads runs here.
        self._open = 0
        self._cond.release()


FORK_GUARD = ForkGuard()
os.register_at_fork(
    before=FORK_GUARD.before_fork,
    after_in_parent=FORK_GUARD.after_fork_in_parent,
    after_in_child=FORK_GUARD.after_fork_in_child,
)


_tracked: list[Engine] = []


def tracked(engine: Engine) -> Engine:
    """``engine``, which a pool process forked later drops (:func:`drop_inherited`)."""
    _tracked.append(engine)
    return engine


def drop_inherited(engines: list[Engine]) -> None:
    """Forget the parent's pooled connections without closing them (closing would end the
    parent's sessions on them); the child opens its own."""
    for engine in [*_tracked, *engines]:
        engine.dispose(close=False)


def sqlite_files(settings: Settings) -> list[Path]:
    """The SQLite database files this worker writes: the control-plane database and a
    SQLite broker (``sqla+sqlite:///``)."""
    files = []
    for url in (settings.database_url, settings.broker_url.removeprefix("sqla+")):
        parsed = make_url(url)
        name = parsed.database or ""
        on_disk = name not in ("", ":memory:") and Path(name).is_file()
        if parsed.drivername.startswith("sqlite") and on_disk:
            files.append(Path(name))
    return files


def write_problem(path: Path) -> str:
    """``""``, or why this process cannot take ``path``'s write lock within
    :data:`WRITE_CHECK_TIMEOUT_S`."""
    try:
        conn = sqlite3.connect(path, timeout=WRITE_CHECK_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:
        return f"{path.name}: {exc}"
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return ""
    except sqlite3.Error as exc:
        return f"{path.name}: {exc}"
    finally:
        conn.close()


def check_writable_or_exit(settings: Settings) -> None:
    """In a new pool process: exit (the pool replaces it) if a database cannot be written,
    the sign of a write lock inherited from the parent."""
    problems = [p for p in map(write_problem, sqlite_files(settings)) if p]
    if problems:
        log.critical(
            "pool process %s cannot write its databases (%s); exiting for a fresh one",
            os.getpid(),
            "; ".join(problems),
        )
        logging.shutdown()
        os._exit(UNUSABLE_EXIT_CODE)
