"""The trainer's periodic checkpoints: save, keep the last K, resume exactly
(:class:`Checkpointer`); the files, their names and the other ranks' state are
:mod:`maskops.checkpoints`'s.

Each holds, besides the model, what a resumed run needs: optimizer, GradScaler, schedule
scaling, RNG states and the data position in micro-batches. Writes are atomic
(``save_checkpoint``), so a run killed mid-save leaves the previous checkpoint intact and
never a torn file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from maskops.checkpoints.model_file import CheckpointError, read_checkpoint, save_checkpoint
from maskops.checkpoints.rng_state import capture_rng_state, restore_rng_state
from maskops.checkpoints.run_directory import BEST_NAME, checkpoint_path, list_checkpoints
from maskops.data.labels import LabelMap
from maskops.spec.models import ExperimentSpec
from maskops.training.errors import TrainingError


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
