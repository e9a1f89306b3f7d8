"""The training engine: a small loop with hooks, the recipe, resume and DDP (several ranks
start under torchrun: :mod:`maskops.training.launcher`).

:func:`run_training` is the entry point the CLI (``maskops train``) and the Celery task
share; :class:`Trainer` and the hooks in :mod:`maskops.training.hooks` are its parts; how it
runs is :class:`~maskops.training.train_options.TrainOptions`. Importing this package imports
nothing heavy: the names below are imported from their modules on first use, so that the
train options (standard library only) are what the control plane imports of the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maskops.training.errors import (
        NonFiniteLossError,
        RankFailed,
        TrainingCancelled,
        TrainingError,
    )
    from maskops.training.hooks import CancelHook
    from maskops.training.schedule import LRSchedule
    from maskops.training.train import STATUS_FILE, TrainResult, run_training
    from maskops.training.train_options import TrainOptions
    from maskops.training.trainer import HookBase, Trainer

_HOMES = {
    "NonFiniteLossError": "errors",
    "RankFailed": "errors",
    "TrainingCancelled": "errors",
    "TrainingError": "errors",
    "CancelHook": "hooks",
    "LRSchedule": "schedule",
    "STATUS_FILE": "train",
    "TrainResult": "train",
    "run_training": "train",
    "TrainOptions": "train_options",
    "HookBase": "trainer",
    "Trainer": "trainer",
}

__all__ = [
    "STATUS_FILE",
    "CancelHook",
    "HookBase",
    "LRSchedule",
    "NonFiniteLossError",
    "RankFailed",
    "TrainOptions",
    "TrainResult",
    "Trainer",
    "TrainingCancelled",
    "TrainingError",
    "run_training",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"maskops.training.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
