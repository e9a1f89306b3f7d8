"""The trainer's periodic checkpoints: save, keep the last K, resume exactly
(:class:`Checkpointer`); the files, their names and the other ranks' state are
:mod:`maskops.checkpoints`'s.

Each holds, besides the model, what a resumed run needs: optimizer, GradScaler, the
:class:`~maskops.training.rules.TrainingRules` its run started with, RNG states and the
data position in micro-batches. Writes are atomic
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
from maskops.training.rules import TAO_RULES, TrainingRules


def read_training_state(path: Path) -> dict[str, Any]:
    """A training checkpoint's contents (model, optimizer, RNG, data position, ...).

    Raises:
        TrainingError: ``path`` is unreadable or holds no training state.
    """
    try:
        state = read_checkpoint(path)
    except CheckpointError as exc:
        raise TrainingError(f"cannot resume: {exc}") from exc
    missing = [k for k in ("optimizer", "rng", "data_position") if k not in state]
    if missing:
        raise TrainingError(
            f"cannot resume from {path}: not a training checkpoint (missing {missing})"
        )
    return state


def checkpoint_rules(path: Path, state: dict[str, Any]) -> TrainingRules:
    """The rules the run of checkpoint ``path`` (contents ``state``) started with; a
    checkpoint of an earlier maskops has none stored and gets that version's.

    Raises:
        TrainingError: it names rules this version does not know.
    """
    try:
        return TrainingRules.from_checkpoint(state.get("scheduler"))
    except (TypeError, ValueError) as exc:
        raise TrainingError(f"cannot resume from {path}: {exc}") from exc


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
    rules: TrainingRules = TAO_RULES

    def save(self, step: int) -> Path:
        path = checkpoint_path(self.directory, step)
        training_state: dict[str, Any] = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {
                "lr_scale": self.rules.lr_scale,
                "step": step,
                "rules": self.rules.to_state(),
            },
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

    def resume(self, path: Path, state: dict[str, Any] | None = None) -> int:
        """Load model, optimizer, scaler and RNG state from ``path`` (already read:
        ``state``); return its step. The run must use the rules it started with
        (:func:`checkpoint_rules`), or it would not end as it would have.

        Raises:
            TrainingError: unreadable, not a training checkpoint, or trained otherwise.
        """
        if state is None:
            state = read_training_state(path)
        started = checkpoint_rules(path, state)
        if started != self.rules:
            raise TrainingError(
                f"cannot resume from {path}: its run started with other training rules "
                f"({started}) than this one ({self.rules})"
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
