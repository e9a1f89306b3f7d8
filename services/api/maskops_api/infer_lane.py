"""``/infer``'s own lane to Triton: at most ``MASKOPS_MAX_CONCURRENT_INFER`` requests wait on
Triton at once, each on a thread of a pool of their own.

A stalled Triton holds each request for up to its timeout. On the threads that serve the
sync routes (Starlette's pool of 40), 40 such requests would leave every other sync route
waiting that long; here they take only threads of their own, and one more request is
answered 429 with ``Retry-After`` at once instead of queueing behind them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from starlette.datastructures import State

from maskops_api.streams import StreamSlots

T = TypeVar("T")

_creating = threading.Lock()


class InferLane:
    """``limit`` slots and as many threads: a call that gets a slot never queues."""

    def __init__(self, limit: int) -> None:
        self.slots = StreamSlots(
            limit, what="/infer requests", setting="MASKOPS_MAX_CONCURRENT_INFER"
        )
        self._threads = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="infer")

    async def run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call(*args, **kwargs)`` on one of the lane's threads.

        Raises:
            TooMany: every slot is taken (429 with ``Retry-After``).
        """
        slot = self.slots.take()
        try:
            future = self._threads.submit(partial(call, *args, **kwargs))
        except BaseException:
            slot.release()
            raise
        # The slot goes back when the thread is done, not when the request is: a client
        # that leaves does not free a thread still waiting on Triton.
        future.add_done_callback(lambda _: slot.release())
        return await asyncio.wrap_future(future)


def infer_lane(state: State) -> InferLane:
    """The app's lane, made on first use with ``state.settings.max_concurrent_infer``."""
    with _creating:
        lane: InferLane | None = getattr(state, "infer_lane", None)
        if lane is None:
            lane = InferLane(state.settings.max_concurrent_infer)
            state.infer_lane = lane
        return lane
