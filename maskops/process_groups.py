"""Process groups: ``maskops serve`` starts each child (the worker; Triton, through
:mod:`maskops.serving.launcher`) in its own session and kills the whole group, so nothing
a child started outlives it (Triton's python backend stubs survive a killed server
otherwise). Standard library only: the launcher imports nothing else."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
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


_PR_SET_PDEATHSIG = 1


def dies_with_parent(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to send ``sig`` to the child when its parent dies
    (None elsewhere).

    A child in a session of its own is out of its parent's signals, so a ``maskops serve``
    killed without stopping its children (SIGKILL, the OOM killer, a CI timeout) left the
    worker and tritonserver running. Linux's "parent" is the thread that started the child:
    start it from a thread that lives as long as the child should. ``prctl`` is looked up
    here: the forked child only calls it.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before the request was made
            os.kill(os.getpid(), sig)

    return preexec
