"""A circuit breaker per Triton replica, so that a replica that stalls or is gone costs one
request its time, not every request.

A replica's circuit opens when a request to it times out or cannot connect; while open the
replica gets no request. After ``open_for_s`` the next request that would go there first
asks Triton's health endpoint (``/v2/health/ready``, a short timeout; one request at a
time: half-open): ready closes the circuit and the request goes on, anything else keeps it
open for another ``open_for_s``. With every circuit open a request is refused at once
(:class:`ReplicasDown`, with the seconds until the next probe).

Imports only :mod:`maskops.serving.client` (the API image has no torch nor onnx).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from maskops.serving.client import TritonUnavailable, is_ready

PROBE_TIMEOUT_S = 2.0
"""How long the half-open health probe waits (``/readyz`` waits as long)."""


class ReplicasDown(TritonUnavailable):
    """No replica can take a request now; ``retry_after_s``: when one may again."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class _Open:
    reason: str
    until: float
    """Monotonic time from which a health probe may close the circuit."""
    probing: bool = False


def probe_health(url: str) -> bool:
    """Whether Triton at ``url`` says it is ready within :data:`PROBE_TIMEOUT_S`."""
    return is_ready(url, timeout_s=PROBE_TIMEOUT_S)


class Circuits:
    """The circuits of any number of replicas (by URL), all closed at first."""

    def __init__(
        self, *, open_for_s: float = 5.0, probe: Callable[[str], bool] = probe_health
    ) -> None:
        self.open_for_s, self._probe = open_for_s, probe
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}

    def usable(self, urls: Sequence[str]) -> list[str]:
        """``urls`` (in their order) less those whose circuit is open and not yet due for a
        probe, or being probed for another request."""
        now = time.monotonic()
        with self._lock:
            return [
                url
                for url in urls
                if (state := self._open.get(url)) is None
                or (state.until <= now and not state.probing)
            ]

    def admit(self, url: str) -> bool:
        """Whether a request may go to ``url`` now: its circuit is closed, or it was due for
        a probe, this request probed it (outside the lock) and Triton is ready."""
        with self._lock:
            state = self._open.get(url)
            if state is None:
                return True
            if state.probing or state.until > time.monotonic():
                return False
            state.probing = True
        ready = self._probe(url)
        with self._lock:
            if ready:
                self._open.pop(url, None)
            else:
                reason = f"{state.reason}; the health probe found it not ready"
                self._open[url] = _Open(reason, time.monotonic() + self.open_for_s)
        return ready

    def trip(self, url: str, reason: str) -> None:
        """Open ``url``'s circuit (again) for ``open_for_s``: ``reason`` says why."""
        with self._lock:
            self._open[url] = _Open(reason, time.monotonic() + self.open_for_s)

    def close(self, url: str) -> None:
        """``url`` answered: its circuit closes."""
        with self._lock:
            self._open.pop(url, None)

    def describe(self, urls: Sequence[str]) -> dict[str, str]:
        """For each of ``urls`` whose circuit is open: why, and when it is probed next."""
        now = time.monotonic()
        with self._lock:
            states = {url: self._open[url] for url in urls if url in self._open}
        return {
            url: f"{s.reason} (circuit open, "
            + ("being probed" if s.probing else f"next probe in {max(0.0, s.until - now):.0f} s")
            + ")"
            for url, s in states.items()
        }

    def wait_s(self, urls: Sequence[str]) -> int:
        """Whole seconds (at least 1) until the first of ``urls``' open circuits is probed."""
        now = time.monotonic()
        with self._lock:
            untils = [self._open[url].until for url in urls if url in self._open]
        return max(1, math.ceil(min(untils, default=now) - now))

    def refusal(self, urls: Sequence[str]) -> ReplicasDown | None:
        """The error for a request that no replica of ``urls`` may take now (each one's
        reason, the seconds until the first probe), or None when one may."""
        if not urls or self.usable(urls):
            return None
        listed = "; ".join(f"{url}: {why}" for url, why in self.describe(urls).items())
        return ReplicasDown(f"no Triton replica is ready: {listed}", self.wait_s(urls))
