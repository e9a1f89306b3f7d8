"""Process groups: nothing a child started outlives the kill of its group, and a child
asked to die with its parent does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from maskops.process_groups import group_members, kill_group

SLEEPER = "import time; time.sleep(600)"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_for(predicate: Callable[[], object], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_killing_a_group_kills_the_grandchildren_too(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    parent_code = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(600)"
    )
    child = subprocess.Popen([sys.executable, "-c", parent_code], start_new_session=True)
    try:
        assert _wait_for(lambda: pid_file.exists() and pid_file.read_text())
        grandchild = int(pid_file.read_text())
        assert sorted(group_members(child.pid)) == sorted([child.pid, grandchild])
        kill_group(child.pid)
        assert group_members(child.pid) == []
        assert not _alive(grandchild)
    finally:
        child.kill()
        child.wait()
    kill_group(child.pid)  # a group that is gone is no error


def test_a_child_asked_to_die_with_its_parent_does(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    # The parent starts the child in a session of its own (out of reach of the parent's
    # signals), then is SIGKILLed: only the kernel's parent-death signal ends the child.
    parent_code = (
        "import signal, subprocess, sys, time; "
        "from maskops.process_groups import dies_with_parent; "
        f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], start_new_session=True, "
        "preexec_fn=dies_with_parent(signal.SIGTERM)); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=dict(os.environ))
    assert _wait_for(lambda: pid_file.exists() and pid_file.read_text())
    orphan = int(pid_file.read_text())
    assert _alive(orphan)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    try:
        assert _wait_for(lambda: not _alive(orphan)), "the child outlived its parent"
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)
