"""One ``maskops serve`` per state dir: an exclusive lock held for the server's lifetime.

Two servers on one state dir would share its SQLite database and data root, and the second
one's start-up would kill the first one's worker and Triton as leftovers of a crashed run
(``children.json``). The lock is ``flock`` on ``<state-dir>/serve.lock``: the kernel drops it
when the holder exits, however it exits, so a crashed server never leaves a stale lock. The
file names the holder (pid, address, start time) for the refusal message.
"""

from __future__ import annotations

import fcntl
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

LOCK_FILE = "serve.lock"


class StateDirBusy(RuntimeError):
    """Another ``maskops serve`` holds the state dir; the message names it."""


class StateDirLock:
    """Hold ``<state_dir>/serve.lock`` exclusively until :meth:`release` or process exit."""

    def __init__(self, state_dir: Path, *, address: str) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / LOCK_FILE
        handle: IO[str] = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(self.path)
            handle.close()
            raise StateDirBusy(
                f"state dir {state_dir} is in use by another maskops serve ({holder}); "
                "stop it, or give this one another --state-dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        started = datetime.now(UTC).isoformat(timespec="seconds")
        handle.write(json.dumps({"pid": os.getpid(), "address": address, "started": started}))
        handle.flush()
        self._handle: IO[str] | None = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the lock
            self._handle = None


def _describe(path: Path) -> str:
    """The holder as its lock file records it."""
    try:
        holder = json.loads(path.read_text())
        return f"pid {holder['pid']}, {holder['address']}, since {holder['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid is not recorded yet"
