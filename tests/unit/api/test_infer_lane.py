"""``/infer``'s lane: at most its limit of calls at once, each on a thread of its own; one
more is refused at once; a slot comes back when its thread is done, not when its caller
leaves (the thread would still be waiting on Triton)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from maskops_api.errors import TooMany
from maskops_api.infer_lane import InferLane


def test_the_lane_is_bounded_and_a_slot_outlives_its_caller() -> None:
    async def scenario() -> None:
        lane = InferLane(2)
        release = threading.Event()
        waiting = [asyncio.ensure_future(lane.run(release.wait, 10)) for _ in range(2)]
        await asyncio.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(TooMany, match="MASKOPS_MAX_CONCURRENT_INFER"):
            await lane.run(time.sleep, 0)
        assert time.monotonic() - started < 0.05  # refused, not queued
        waiting[0].cancel()  # its client left; the thread still waits
        await asyncio.sleep(0.05)
        assert lane.slots.taken == 2
        with pytest.raises(TooMany):
            await lane.run(time.sleep, 0)
        release.set()
        assert await waiting[1] is True
        deadline = time.monotonic() + 5
        while lane.slots.taken and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert lane.slots.taken == 0
        assert await lane.run(threading.current_thread) is not threading.current_thread()

    asyncio.run(scenario())
