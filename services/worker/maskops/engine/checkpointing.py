"""Periodic training checkpoints in RESULTS_DIR: save, keep the last K, find, resume.

Files are ``model.step-N.pth`` (TAO's ``model.step-N`` naming) in the maskops checkpoint
format (see :mod:`maskops.checkpoint`), with the training state a resumed run needs:
optimizer, GradScaler, schedule scaling, RNG states and the data position in micro-batches.
Writes are atomic (``save_checkpoint`` writes a temporary file and renames it), so a run
killed mid-save leaves the previous checkpoint intact and never a torn file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from maskops.atomic import atomic_path
from maskops.checkpoint import CheckpointError, read_checkpoint, save_checkpoint
from maskops.data.labels import LabelMap
from maskops.engine.errors import TrainingError
from maskops.engine.state import capture_rng_state, restore_rng_state
from maskops.spec.models import ExperimentSpec

_NAME = re.compile(r"^model\.step-(\d+)\.pth$")
BEST_NAME = "model.best.pth"
"""The best checkpoint by the validation metric (see BestCheckpointHook): weights only."""
CHOICES = ("best", "latest")


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"model.step-{step}.pth"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every training checkpoint in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(directory: Path) -> Path | None:
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1][1] if checkpoints else None


def resolve_model_path(path: Path) -> Path:
    """The model file a ``-m`` argument names: ``RESULTS_DIR/best`` or
    ``RESULTS_DIR/latest`` (a training results directory and a choice) the best or newest
    checkpoint in it; a bare ``RESULTS_DIR`` its best, or its newest when no best was kept.
    Anything else (a model file, or a path that does not exist) is returned unchanged, for
    the loader to open or to report.

    Raises:
        FileNotFoundError: the results directory holds no such checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        directory, choice = path, "best" if (path / BEST_NAME).is_file() else "latest"
    elif path.name in CHOICES and not path.exists() and path.parent.is_dir():
        directory, choice = path.parent, path.name
    else:
        return path
    found = directory / BEST_NAME if choice == "best" else latest_checkpoint(directory)
    if found is None or not found.is_file():
        what = BEST_NAME if choice == "best" else "model.step-N.pth checkpoint"
        raise FileNotFoundError(f"{directory}: no {what} (is it a training results directory?)")
    return found


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


@dataclass
class Checkpointer:
    """Saves and restores everything a run needs to continue exactly where it stopped."""

    directory: Path
    keep: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    spec: ExperimentSpec
    label_map: LabelMap
    scaler: torch.amp.GradScaler | None = None
    accumulate_grad_steps: int = 1
    lr_scale: float = 1.0

    def save(self, step: int) -> Path:
        path = checkpoint_path(self.directory, step)
        training_state: dict[str, Any] = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"lr_scale": self.lr_scale, "step": step},
            "rng": capture_rng_state(),
            "data_position": step * self.accumulate_grad_steps,
        }
        if self.scaler is not None:
            training_state["scaler"] = self.scaler.state_dict()
        save_checkpoint(
            path,
            model=self.model,
            spec=self.spec,
            label_map=self.label_map,
            step=step,
            **training_state,
        )
        self._prune()
        return path

    def save_best(self, step: int) -> Path:
        """Write the model (weights, spec, label map; no training state) as BEST_NAME."""
        return save_checkpoint(
            self.directory / BEST_NAME,
            model=self.model,
            spec=self.spec,
            label_map=self.label_map,
            step=step,
        )

    def _prune(self) -> None:
        checkpoints = list_checkpoints(self.directory)
        for _, path in checkpoints[: max(0, len(checkpoints) - max(1, self.keep))]:
            path.unlink(missing_ok=True)

    def resume(self, path: Path) -> int:
        """Load model, optimizer, scaler and RNG state from ``path``; return its step."""
        try:
            state = read_checkpoint(path)
        except CheckpointError as exc:
            raise TrainingError(f"cannot resume: {exc}") from exc
        missing = [k for k in ("optimizer", "rng", "data_position") if k not in state]
        if missing:
            raise TrainingError(
                f"cannot resume from {path}: not a training checkpoint (missing {missing})"
            )
        step = int(state["step"])
        saved_accumulate = int(state["data_position"]) // step if step else 0
        if step and saved_accumulate != self.accumulate_grad_steps:
            raise TrainingError(
                f"cannot resume from {path}: it was trained with accumulate_grad_steps "
                f"{saved_accumulate}, the spec now says {self.accumulate_grad_steps}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        restore_rng_state(state["rng"])
        return step
