"""A bound on concurrent long-lived responses (``GET /jobs/{id}/logs?follow=true``).

A stream lasts as long as its job runs; without a bound, enough of them would take every
worker thread or database connection the other routes need. A slot is taken when the
route answers and given back when the stream ends, however it ends: finished, failed, its
client gone, or never started (Starlette drops a response whose client left before the
first chunk without running its generator; the slot is then given back when the
generator is collected).
"""

from __future__ import annotations

import threading

from maskops_api.errors import TooMany


class StreamSlots:
    """At most ``limit`` slots taken at once; ``setting`` names what raises the limit."""

    def __init__(self, limit: int, *, what: str, setting: str) -> None:
        self.limit = limit
        self.what = what
        self.setting = setting
        self._taken = 0
        self._lock = threading.Lock()

    @property
    def taken(self) -> int:
        return self._taken

    def take(self) -> Slot:
        """A slot, or ``TooMany`` (429 with ``Retry-After``) when all are taken."""
        with self._lock:
            if self._taken >= self.limit:
                raise TooMany(
                    f"{self._taken} {self.what} are open, the most this server allows "
                    f"({self.setting}); retry when one has ended"
                )
            self._taken += 1
        return Slot(self)

    def _give_back(self) -> None:
        with self._lock:
            self._taken -= 1


class Slot:
    """One taken slot; :meth:`release` gives it back once, however often it is called."""

    def __init__(self, slots: StreamSlots) -> None:
        self._slots: StreamSlots | None = slots

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots._give_back()

    def __del__(self) -> None:
        self.release()
