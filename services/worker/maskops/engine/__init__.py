"""The training engine: a small loop with hooks, the recipe, resume and DDP (several ranks
start under torchrun: :mod:`maskops.engine.launcher`).

:func:`run_training` is the entry point the CLI (``maskops train``) and the Celery task
share; :class:`Trainer` and the hooks in :mod:`maskops.engine.hooks` are its parts.
"""

from maskops.engine.errors import (
    NonFiniteLossError,
    RankFailed,
    TrainingCancelled,
    TrainingError,
)
from maskops.engine.hooks import CancelHook
from maskops.engine.schedule import LRSchedule
from maskops.engine.train import STATUS_FILE, TrainResult, run_training
from maskops.engine.trainer import HookBase, Trainer

__all__ = [
    "STATUS_FILE",
    "CancelHook",
    "HookBase",
    "LRSchedule",
    "NonFiniteLossError",
    "RankFailed",
    "TrainResult",
    "Trainer",
    "TrainingCancelled",
    "TrainingError",
    "run_training",
]
