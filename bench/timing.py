"""Timing for benchmarks whose baseline runs in the same process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def paired_median_seconds(fns: list[Callable[[], Any]], reps: int, warmup: int = 1) -> list[float]:
    """Median seconds of each workload, timed in turn within every repetition.

    These VMs change speed from minute to minute (neighbours, the host): workloads timed
    one after the other would compare the minutes as much as the workloads. The warm-up
    runs fill allocators, oneDNN's primitive cache and the like.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, sink in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            sink.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]
