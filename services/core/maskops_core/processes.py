"""Process groups: ``maskops serve`` starts each child (worker, Triton) in its own session
and kills the whole group, so nothing a child started outlives it (Triton's python backend
stubs survive a killed server otherwise)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def signal_group(pgid: int, sig: int) -> None:
    """Signal process group ``pgid``; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Processes (zombies excluded) of process group ``pgid``, read from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) may hold spaces; the fields after it do not.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def kill_group(pgid: int, *, timeout_s: float = 10.0) -> None:
    """SIGKILL process group ``pgid`` and wait (bounded) until none of it is left."""
    signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
