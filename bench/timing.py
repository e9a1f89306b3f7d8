"""Timing for benchmarks whose arms (a workload and its baseline) run in the same session.

These VMs change speed from minute to minute (neighbours, the host): arms timed one after
the other would compare the minutes as much as the arms. So every arm runs once per round,
in turn, for several rounds, and each is reported by its median and its range over the
rounds (the range says how far one round can be trusted).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    """One arm's measurements over the rounds."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100), nearest rank: with few rounds p99 is the max."""
        ordered = sorted(self.values)
        rank = max(1, -(-len(ordered) * q // 100))
        return ordered[int(rank) - 1]

    def summary(self, unit: str, scale: float = 1.0, digits: int = 4) -> dict[str, Any]:
        """Median, min and max (times ``scale``), keyed ``median_<unit>`` etc., and rounds."""
        return {
            f"median_{unit}": round(self.median * scale, digits),
            f"min_{unit}": round(min(self.values) * scale, digits),
            f"max_{unit}": round(max(self.values) * scale, digits),
            "rounds": len(self.values),
        }


def alternate(
    measures: Sequence[Callable[[], float]], rounds: int, warmup: int = 1
) -> list[Spread]:
    """Run every measure once per round, in turn, ``rounds`` times after ``warmup`` rounds.

    Each measure returns its own figure (seconds, images/s): the warm-up rounds fill
    allocators, oneDNN's primitive cache and the like and are not kept.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    for _ in range(warmup):
        for measure in measures:
            measure()
    values: list[list[float]] = [[] for _ in measures]
    for _ in range(rounds):
        for measure, sink in zip(measures, values, strict=True):
            sink.append(measure())
    return [Spread(tuple(v)) for v in values]


def seconds_of(fn: Callable[[], Any]) -> Callable[[], float]:
    """A measure: the wall seconds one call of ``fn`` takes."""

    def measure() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return measure


def alternated_seconds(
    fns: Sequence[Callable[[], Any]], rounds: int, warmup: int = 1
) -> list[Spread]:
    """Wall seconds of each workload, timed in turn within every round."""
    return alternate([seconds_of(fn) for fn in fns], rounds, warmup)
