"""An ordered ``map`` over forked worker processes, for the data tools' per-image work
(conversion, drawing the demo data)."""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.pool import AsyncResult
from typing import TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")


def worker_count(requested: int | None) -> int:
    """``requested`` processes, or up to 4 by the cores this process may use; one inside a
    daemonic process."""
    if multiprocessing.current_process().daemon:
        return 1  # daemonic processes (Celery prefork children) may not have children
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, requested if requested is not None else min(4, cores or 1))


class OrderedPool:
    """``map`` over worker processes, in order, with at most ``4 * workers`` items in flight.

    fork: workers start in milliseconds without re-importing anything; what they run only
    touches PIL, numpy and pycocotools, never threads of the parent. One worker: in-process.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool = multiprocessing.get_context("fork").Pool(workers) if workers > 1 else None

    def map(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> Iterator[_R]:
        if self._pool is None:
            yield from map(fn, items)
            return
        pending: deque[AsyncResult[_R]] = deque()
        for item in items:
            pending.append(self._pool.apply_async(fn, (item,)))
            if len(pending) >= 4 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def __enter__(self) -> OrderedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
