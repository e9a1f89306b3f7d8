"""The suite stops before its first test where the disk cannot hold a run, saying why
(tests/conftest.py): pytest's temporary folder on a real 64 MiB tmpfs, mounted in a mount
namespace of the test's own (``unshare --user --map-root-user --mount``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_a_run_on_a_disk_too_small_stops_at_once_naming_the_space(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs util-linux's unshare")
    small = tmp_path / "small"
    small.mkdir()
    pytest_run = (
        f"{sys.executable} -m pytest -p no:cacheprovider -p no:xdist --basetemp {small}/run "
        "--collect-only tests/unit/test_suite_disk_check.py"  # the check comes first
    )
    command = f"mount -t tmpfs -o size=64m tmpfs {small} && exec {pytest_run}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", command],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    if done.stderr.startswith("unshare:") or "mount: " in done.stderr:
        pytest.skip(f"no tmpfs can be mounted here: {done.stderr.strip()[-300:]}")
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]
    assert f"GiB free in {small}/run: the tests need 7 GiB there" in said, said[-3000:]
    assert "collected" not in said  # stopped before collecting
