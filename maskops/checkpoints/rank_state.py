"""The random state of ranks 1..N-1 of a multi-rank run, saved beside each checkpoint, and
the newest checkpoint every rank can resume from."""

from __future__ import annotations

from pathlib import Path

import torch

from maskops.atomic import atomic_path
from maskops.checkpoints.rng_state import capture_rng_state, restore_rng_state
from maskops.checkpoints.run_directory import list_checkpoints

RANK_STATE_DIR = "rank_state"
"""RNG states of ranks 1..N-1, one file per rank and checkpoint step: each rank samples with
its own generator, so a resumed multi-rank run restores every rank's (rank 0's is in the
checkpoint)."""


def rank_state_path(directory: Path, rank: int, step: int) -> Path:
    return directory / RANK_STATE_DIR / f"rank-{rank}.step-{step}.pth"


def save_rank_state(directory: Path, rank: int, step: int, *, keep: int) -> Path:
    """Write this rank's RNG state at ``step`` (atomically); keep its newest ``keep + 1``."""
    path = rank_state_path(directory, rank, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(capture_rng_state(), tmp)
    mine = sorted(
        path.parent.glob(f"rank-{rank}.step-*.pth"),
        key=lambda p: int(p.stem.rsplit("-", 1)[1]),
    )
    for old in mine[: max(0, len(mine) - max(1, keep) - 1)]:
        old.unlink(missing_ok=True)
    return path


def resumable_checkpoint(directory: Path, world_size: int) -> Path | None:
    """The newest checkpoint for which ranks 1..``world_size``-1 saved their random state.

    Rank 0 writes the checkpoint and each other rank its state, at the same step but not at
    the same instant: a rank killed in between leaves a checkpoint it has no state for, and
    resuming there would sample with rank 0's random state (other weights than an
    uninterrupted run). The newest checkpoint when none has every rank's (a run resumed on
    more ranks than it was saved by). Every rank of a restarted group reads the same files,
    so they agree on the step.
    """
    checkpoints = list_checkpoints(directory)
    for step, path in reversed(checkpoints):
        if all(rank_state_path(directory, r, step).is_file() for r in range(1, world_size)):
            return path
    return checkpoints[-1][1] if checkpoints else None


def restore_rank_state(directory: Path, rank: int, step: int) -> bool:
    """Restore this rank's RNG state of ``step``; False when it was not saved (the rank
    then continues with rank 0's)."""
    path = rank_state_path(directory, rank, step)
    if not path.is_file():
        return False
    restore_rng_state(torch.load(path, weights_only=True))
    return True
