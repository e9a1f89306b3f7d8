"""Process groups under torchrun, with the launcher's command and environment: a restarted
group forms on a store of its own (it once found the dead group's addresses on
torchrun's store and hung), and forming a group or waiting in a collective is bounded.
The ranks are tests/unit/training/distributed_probe.py (gloo, no model: seconds each). And
the checkpoint a restarted group resumes from is one every rank saved its state for."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from maskops.checkpoints.rank_state import resumable_checkpoint, save_rank_state
from maskops.checkpoints.run_directory import checkpoint_path
from maskops.training.launcher import RankPlan, torchrun_command, torchrun_environment

REPO = Path(__file__).resolve().parents[3]
PROBE = "tests.unit.training.distributed_probe"


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


def test_a_restarted_group_resumes_from_the_newest_checkpoint_every_rank_saved(
    tmp_path: Path,
) -> None:
    """Rank 1 died after rank 0 wrote step 6's checkpoint but before it saved its own
    state of step 6: the group resumes from step 3, where both saved theirs."""
    assert resumable_checkpoint(tmp_path, 2) is None
    for step in (3, 6):
        checkpoint_path(tmp_path, step).write_bytes(b"")
    save_rank_state(tmp_path, 1, 3, keep=2)
    assert resumable_checkpoint(tmp_path, 2) == checkpoint_path(tmp_path, 3)
    assert resumable_checkpoint(tmp_path, 1) == checkpoint_path(tmp_path, 6)
    # Saved by 2 ranks, resumed on 3: no checkpoint has rank 2's state, the newest is used.
    assert resumable_checkpoint(tmp_path, 3) == checkpoint_path(tmp_path, 6)
    save_rank_state(tmp_path, 1, 6, keep=2)
    assert resumable_checkpoint(tmp_path, 2) == checkpoint_path(tmp_path, 6)
