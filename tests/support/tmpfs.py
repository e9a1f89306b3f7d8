"""Run a command with a real tmpfs of a given size mounted where the test says, in a mount
namespace of its own (``unshare --user --map-root-user --mount``: no privileges needed where
unprivileged user namespaces are allowed), so that every ``ENOSPC`` is the kernel's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def run_on_tmpfs(
    folder: Path,
    size: str,
    command: str,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run shell ``command`` with a tmpfs of ``size`` (``mount -o size=``) on ``folder``;
    the test is skipped where none can be mounted."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs util-linux's unshare")
    mounted = f"mount -t tmpfs -o size={size} tmpfs {folder} && exec {command}"
    done = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", mounted],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout_s,
    )  # fmt: skip
    refused = done.stderr.startswith("unshare:") or "mount: " in done.stderr
    if done.returncode != 0 and refused and not done.stdout:
        pytest.skip(f"no tmpfs can be mounted here: {done.stderr.strip()[-300:]}")
    return done
