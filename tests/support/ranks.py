"""Find the torchrun ranks training into a results directory (Linux ``/proc``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

RANK_MODULE = "maskops.training.rank_main"


def rank_pids(results_dir: Path) -> dict[int, int]:
    """``{rank: pid}`` of the live ``maskops.training.rank_main`` processes of ``results_dir``
    (not their data-loader workers, which share the command line and environment)."""
    ranks: dict[int, tuple[int, int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if RANK_MODULE.encode() not in argv or str(results_dir).encode() not in argv:
                continue
            environ = dict(
                item.split(b"=", 1)
                for item in (proc / "environ").read_bytes().split(b"\0")
                if b"=" in item
            )
            state, ppid = (proc / "stat").read_text().split(") ", 1)[1].split()[:2]
        except OSError:
            continue  # exited meanwhile
        if state != "Z" and b"RANK" in environ:
            ranks[int(proc.name)] = (int(environ[b"RANK"]), int(ppid))
    return {rank: pid for pid, (rank, ppid) in ranks.items() if ppid not in ranks}


def wait_until(condition: Callable[[], object], *, timeout_s: float, what: str) -> None:
    """Poll ``condition()`` every 0.1 s until it is true; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s} s")
