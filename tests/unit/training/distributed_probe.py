"""A rank for tests/unit/training/test_distributed_restarts.py, started by torchrun through
the launcher's command and environment: ``python -m tests.unit.training.distributed_probe
SCENARIO OUT_DIR``. Each rank forms its group as a training rank does (``run_rank``, short
timeouts) and writes what it saw to ``OUT_DIR/rank-R.json``.

Scenarios:

* ``restart``: in the first group rank 1 leaves a key in the store the group formed on,
  then dies by SIGKILL (rank 0 fails in its next collective and torchrun restarts both);
  in the restarted group rank 0 comes late, so rank 1 looks for rank 0's address before
  rank 0 has written it. Each rank of the second group records whether the first group's
  key is still visible and the sum of an all_reduce.
* ``late_peer``: rank 1 never joins; rank 0 records the error forming the group.
* ``silent_peer``: rank 1 joins, then makes no collective; rank 0 records the error of its
  all_reduce.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from maskops.training.distributed import GroupTimeouts, RankInfo, run_rank

TIMEOUTS = GroupTimeouts(init_s=20.0, collective_s=20.0)
SHORT = GroupTimeouts(init_s=3.0, collective_s=3.0)
FIRST_GROUP_KEY = "probe/first-group"
LATE_S = 3.0


def _store() -> dist.TCPStore:
    """A client of the store the group formed on (MASTER_ADDR:MASTER_PORT)."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=10),
    )


def _sum_of_ones() -> float:
    value = torch.ones(1)
    dist.all_reduce(value)
    return float(value.item())


def _restart(info: RankInfo, attempt: int) -> dict[str, Any]:
    store = _store()
    if attempt == 0:
        store.set(FIRST_GROUP_KEY, "1")
        _sum_of_ones()
        if info.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        _sum_of_ones()  # fails: rank 1 is gone
        raise AssertionError("rank 1 was killed, yet the all_reduce returned")
    return {"first_group_key_seen": store.check([FIRST_GROUP_KEY]), "sum": _sum_of_ones()}


def _error_of(call: Any) -> dict[str, Any]:
    try:
        call()
    except RuntimeError as exc:
        return {"error_type": type(exc).__name__, "error": str(exc)}
    return {"error": None}


def main(scenario: str, out_dir: Path) -> None:
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    started = time.monotonic()
    record: dict[str, Any]
    if scenario == "restart":
        if attempt and rank == 0:
            time.sleep(LATE_S)
        record = run_rank(_restart, gpu_index=0, timeouts=TIMEOUTS, args=(attempt,))
    elif rank == 1:
        if scenario == "silent_peer":  # in the group until rank 0's all_reduce gave up
            run_rank(lambda info: time.sleep(2 * SHORT.collective_s), gpu_index=0, timeouts=SHORT)
        return
    elif scenario == "late_peer":
        record = _error_of(lambda: run_rank(lambda info: None, gpu_index=0, timeouts=SHORT))
    else:
        record = run_rank(lambda info: _error_of(_sum_of_ones), gpu_index=0, timeouts=SHORT)
    record |= {"attempt": attempt, "seconds": time.monotonic() - started}
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
