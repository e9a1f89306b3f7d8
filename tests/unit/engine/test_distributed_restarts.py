"""Process groups under torchrun, with the launcher's command and environment: a restarted
group forms on a store of its own (issue 26: it found the dead group's addresses on
torchrun's store and hung), and forming a group or waiting in a collective is bounded.
The ranks are tests/unit/engine/distributed_probe.py (gloo, no model: seconds each)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from maskops.engine.launcher import RankPlan, torchrun_command, torchrun_environment

REPO = Path(__file__).resolve().parents[3]
PROBE = "tests.unit.engine.distributed_probe"


def _run_probe(scenario: str, out_dir: Path, *, max_restarts: int = 0) -> dict[int, Any]:
    """Two probe ranks under torchrun; ``{rank: what it recorded}``."""
    plan = RankPlan(nproc_per_node=2, max_restarts=max_restarts)
    command = torchrun_command(plan, [scenario, str(out_dir)], module=PROBE)
    done = subprocess.run(
        command,
        cwd=REPO,
        env=torchrun_environment(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out_dir.glob("*.json")}


def test_a_group_restarted_after_a_sigkill_forms_on_a_store_of_its_own(tmp_path: Path) -> None:
    """Rank 1 is SIGKILLed; in the restarted group rank 0 comes 3 s late. On torchrun's
    shared store rank 1 then read the dead rank 0's address and never connected."""
    records = _run_probe("restart", tmp_path, max_restarts=1)
    assert sorted(records) == [0, 1]
    for record in records.values():
        assert record["attempt"] == 1 and record["sum"] == 2.0
        assert record["first_group_key_seen"] is False


def test_a_peer_that_never_joins_fails_the_group_within_the_init_timeout(
    tmp_path: Path,
) -> None:
    record = _run_probe("late_peer", tmp_path)[0]
    assert record["error_type"] == "ProcessGroupError"
    assert record["error"].startswith("rank 0 could not form the group of 2 ranks at ")
    assert "within 3 s: " in record["error"]
    assert record["seconds"] < 30


def test_a_peer_that_makes_no_collective_fails_the_collective_within_its_timeout(
    tmp_path: Path,
) -> None:
    record = _run_probe("silent_peer", tmp_path)[0]
    assert record["error_type"] == "RuntimeError" and "imed out" in record["error"]
    assert record["seconds"] < 30
