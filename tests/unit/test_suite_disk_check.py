"""The suite stops before its first test where the disk cannot hold a run, saying why
(tests/conftest.py): pytest's temporary folder on a real 64 MiB tmpfs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.conftest import CHECK_DISK_ENV
from tests.support.tmpfs import run_on_tmpfs

REPO = Path(__file__).resolve().parents[2]


def test_a_run_on_a_disk_too_small_stops_at_once_naming_the_space(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    pytest_run = (
        f"{sys.executable} -m pytest -p no:cacheprovider -p no:xdist --basetemp {small}/run "
        "--collect-only tests/unit/test_suite_disk_check.py"  # the check comes first
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env[CHECK_DISK_ENV] = "1"  # as ./dev test sets it
    done = run_on_tmpfs(small, "64m", pytest_run, env=env, cwd=REPO)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]
    assert f"GiB free in {small}/run: the tests need 7 GiB there" in said, said[-3000:]
    assert "collected" not in said  # stopped before collecting
