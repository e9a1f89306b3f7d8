"""Worker threads for post-processing, each with a single torch intra-op thread.

Mask pasting is thousands of small torch ops (one bilinear resize per detection). Torch
spreads each op over its intra-op threads, and at these sizes the fork/join costs more than
it saves: measured on a busy 2-core machine, a 300x300 resize took 25 ms on 2 threads and
1 ms on one, and pasting 100 masks into an 832x1344 image 5x longer. Parallelism comes from
several images at once instead: a small pool of threads, each running torch single-threaded.

``torch.set_num_threads`` sets the calling thread's OpenMP thread count and a process-wide
default that threads created later start from. The pool's threads set 1 for themselves,
then the default is put back, so the rest of the process (model inference) is unaffected.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

WORKERS = max(1, min(4, os.cpu_count() or 1))
"""Post-processing threads: the resize and the RLE compression release the GIL."""

_local = threading.local()
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _init_worker() -> None:
    torch.set_num_threads(1)
    # Torch settles a thread's count on its first parallel op or get_num_threads(), from
    # the process-wide default: do that now, while the default is 1.
    if torch.get_num_threads() != 1:
        raise RuntimeError("could not make a post-processing thread single-threaded")
    _local.single_threaded = True


def _forget_pool() -> None:
    # A forked child (DataLoader worker, Celery prefork) has none of the parent's threads.
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def postprocess_pool() -> ThreadPoolExecutor:
    """The process's post-processing pool (created on first use)."""
    global _pool
    with _lock:
        if _pool is None:
            default = torch.get_num_threads()
            pool = ThreadPoolExecutor(
                max_workers=WORKERS,
                thread_name_prefix="maskops-postprocess",
                initializer=_init_worker,
            )
            # Start every worker now (each waits for the others), so that the default their
            # initialiser changed is restored before anything else can start a thread.
            barrier = threading.Barrier(WORKERS)
            for future in [pool.submit(barrier.wait) for _ in range(WORKERS)]:
                future.result()
            torch.set_num_threads(default)
            _pool = pool
        return _pool


def run_single_threaded(fn: Callable[..., R], *args: object) -> R:
    """``fn(*args)`` on a post-processing thread (directly when already on one)."""
    if getattr(_local, "single_threaded", False):
        return fn(*args)
    return postprocess_pool().submit(fn, *args).result()


def map_single_threaded(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(item) for item in items]``, spread over the post-processing threads."""
    items = list(items)
    if len(items) <= 1 or getattr(_local, "single_threaded", False):
        return [fn(item) for item in items]
    return list(postprocess_pool().map(fn, items))
