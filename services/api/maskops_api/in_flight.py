"""Requests that share an ``Idempotency-Key`` run one after the other, never side by side.

Concurrent retries of one request (a client that timed out and retried, a proxy replaying)
used to run together: each held a database connection while the first one's insert won
and the others rolled back, and under load they waited for worker threads while holding
those connections, until the pool ran dry (500s, minute-long stalls). Now the first
request with a key runs; later ones with the same key wait for it on the event loop
(holding neither a thread nor a connection), then replay its answer from the key's row.
Across API processes the key's primary key still decides (:mod:`services.idempotency`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
from fastapi.concurrency import run_in_threadpool

from maskops_api.errors import Conflict

T = TypeVar("T")

WAIT_S = 30.0
"""How long a request waits for the first one with its key before answering 409."""


class KeysInFlight:
    """The keys of this process's requests in progress, per endpoint."""

    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.wait_s = wait_s
        self._flights: dict[tuple[str, str], anyio.Event] = {}

    async def run(self, endpoint: str, key: str | None, work: Callable[[], T]) -> T:
        """``work()`` in the threadpool, after any request in flight with ``key`` has
        ended (409 if it takes longer than ``wait_s``)."""
        if not key:
            return await run_in_threadpool(work)
        ident = (endpoint, key)
        first = self._flights.get(ident)
        if first is not None:
            with anyio.move_on_after(self.wait_s) as waited:
                await first.wait()
            if waited.cancelled_caught:
                raise Conflict(
                    f"a request with Idempotency-Key {key!r} is still in progress; retry"
                )
            return await run_in_threadpool(work)
        done = self._flights[ident] = anyio.Event()
        try:
            return await run_in_threadpool(work)
        finally:
            del self._flights[ident]
            done.set()
