"""Find the torchrun ranks training into a results directory (Linux ``/proc``)."""

from __future__ import annotations

import os
import signal
import subprocess
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


def run_ranks(command: list[str], results_dir: Path, *, timeout_s: float) -> str:
    """Run ``command`` (one that trains into ``results_dir`` on torchrun's ranks) to its end;
    its stdout and stderr together. AssertionError when it fails, and when it runs past
    ``timeout_s``: then each live rank first writes every thread's Python stack (SIGABRT,
    under ``PYTHONFAULTHANDLER``) into that output, which says where a hung run waits."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
    ) as run:
        try:
            output = run.communicate(timeout=timeout_s)[0]
        except subprocess.TimeoutExpired:
            for pid in rank_pids(results_dir).values():
                os.kill(pid, signal.SIGABRT)
            time.sleep(5)
            os.killpg(run.pid, signal.SIGKILL)
            output = run.communicate()[0]
            said = output.decode(errors="replace")[-12000:]
            raise AssertionError(f"not ended within {timeout_s} s; its output:\n{said}") from None
    said = output.decode(errors="replace")
    assert run.returncode == 0, said[-3000:]
    return said
