"""Pool processes forked from the worker's main process, on a real SQLite database.

SQLite marks a process's locks in memory shared by its connections; a process forked while
another thread held the write lock inherits the mark, and its writes fail with "database is
locked" for ever. The heartbeat's transaction holds off forks; a pool process that inherited
a lock anyway exits for a fresh one; a worker whose tasks all fail on its database or broker
says so in its heartbeat row, which ``/readyz`` reports.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from maskops_core.settings import Settings
from maskops_core.workers import check_workers
from maskops_worker import forks, streak
from maskops_worker.liveness import _Beater


def _db(settings: Settings) -> Path:
    return Path(settings.database_url.removeprefix("sqlite:///"))


def _child_exit_code(child: Callable[[], int]) -> int:
    """Fork; the child runs ``child`` and exits with what it returns (never raises)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = child()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _child_writes(path: Path) -> Callable[[], int]:
    def write() -> int:
        conn = sqlite3.connect(path, timeout=2, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return 0
        except sqlite3.OperationalError:
            return 1
        finally:
            conn.close()

    return write


@pytest.fixture
def beater(settings: Settings) -> Iterator[_Beater]:
    beater = _Beater(
        "w1@host", [settings.gpu_queue], settings.model_copy(update={"worker_gpus": 0})
    )
    yield beater
    beater.engine.dispose()


def test_a_fork_waits_for_the_heartbeats_transaction(settings: Settings, beater: _Beater) -> None:
    inside = threading.Event()

    def hold_the_write_lock(*_: Any) -> None:
        # Fired before the commit: the row is written, SQLite's write lock is held.
        inside.set()
        time.sleep(0.5)

    event.listen(beater.engine, "commit", hold_the_write_lock)
    beat = threading.Thread(target=beater._beat)
    beat.start()
    assert inside.wait(10)
    code = _child_exit_code(_child_writes(_db(settings)))
    beat.join()
    assert code == 0, "the pool process inherited the heartbeat's write lock"


@pytest.fixture
def lock_held_elsewhere(settings: Settings) -> Iterator[None]:
    """A thread of this process holds the database's write lock (as Celery's main thread
    holds a SQLite broker's during a poll, outside the guard) until the test ends."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(_db(settings), isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")
        taken.set()
        release.wait(30)
        conn.execute("ROLLBACK")
        conn.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(10)
    yield
    release.set()
    holder.join()


def test_a_pool_process_that_inherited_a_write_lock_exits(
    settings: Settings, lock_held_elsewhere: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forks, "WRITE_CHECK_TIMEOUT_S", 0.5)

    def start_pool_process() -> int:
        forks.check_writable_or_exit(settings)
        return 0

    assert _child_exit_code(start_pool_process) == forks.UNUSABLE_EXIT_CODE


def test_a_pool_process_that_can_write_carries_on(settings: Settings) -> None:
    def start_pool_process() -> int:
        forks.check_writable_or_exit(settings)
        return 0

    assert forks.sqlite_files(settings) == [_db(settings)]
    assert _child_exit_code(start_pool_process) == 0


def test_readyz_sees_a_worker_whose_tasks_all_fail_on_its_database(
    settings: Settings, factory: sessionmaker[Session], beater: _Beater
) -> None:
    locked = OperationalError("INSERT ...", {}, sqlite3.OperationalError("database is locked"))
    try:
        for _ in range(streak.FAILING_AFTER):
            beater._beat()
            with factory() as session:
                assert check_workers(session, settings) == "ok"
            streak.task_ended(locked)
        beater._beat()
        with factory() as session:
            check = check_workers(session, settings)
        assert check.startswith(
            f"worker w1@host: its last {streak.FAILING_AFTER} tasks failed on infrastructure"
            " errors (last: OperationalError: (sqlite3.OperationalError) database is locked"
        ), check
        streak.task_ended(ValueError("a job's own failure ends the run"))
        beater._beat()
        with factory() as session:
            assert check_workers(session, settings) == "ok"
    finally:
        streak.task_ended(None)
