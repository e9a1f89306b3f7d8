"""This worker's run of consecutive tasks that failed on its infrastructure (its database
or broker refused it), shared by its pool processes and reported in its heartbeat row: a
pool process that fails everything it takes is seen by ``/readyz``, not only in its log.

The counters live in shared memory made by the main process before it forks the pool, so
every pool process adds to the same run and the main process's heartbeat reads it.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from kombu.exceptions import OperationalError as BrokerOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import OperationalError as DatabaseOperationalError

INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    BrokerOperationalError,
    RedisConnectionError,
    DatabaseOperationalError,
)
"""Failures of the worker's database or broker, not of the job: the same job would run
elsewhere (its task is retried)."""
FAILING_AFTER = 3
"""Consecutive infrastructure failures after which the worker reports itself failing."""
_LAST_ERROR_BYTES = 300

_run = multiprocessing.Value("i", 0)
_last_error: Any = multiprocessing.Array("c", _LAST_ERROR_BYTES)  # a SynchronizedString


def task_ended(error: BaseException | None) -> None:
    """Record how a task ended: an infrastructure error lengthens the run, anything else
    (success, or a failure of the job itself) ends it."""
    with _run.get_lock():
        if isinstance(error, INFRASTRUCTURE_ERRORS):
            _run.value += 1
            text = f"{type(error).__name__}: {' '.join(str(error).split())}"
            _last_error.value = text.encode("utf-8", "replace")[: _LAST_ERROR_BYTES - 1]
        else:
            _run.value = 0


def failing() -> str:
    """``""``, or what the heartbeat row says once :data:`FAILING_AFTER` tasks in a row
    failed on infrastructure errors."""
    with _run.get_lock():
        count, last = _run.value, _last_error.value.decode("utf-8", "replace")
    if count < FAILING_AFTER:
        return ""
    return f"its last {count} tasks failed on infrastructure errors (last: {last})"
