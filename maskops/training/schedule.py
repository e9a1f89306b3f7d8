"""The learning-rate schedule of TAO's Mask R-CNN recipe.

Linear warmup from ``warmup_learning_rate`` to ``init_learning_rate`` over ``warmup_steps``,
then a step schedule: after each boundary in ``learning_rate_steps`` the rate is
``init_learning_rate * learning_rate_decay_levels[i]``. The levels are absolute multipliers
of the initial rate (0.1, 0.02, 0.002), not successive factors.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from maskops.spec.models import ExperimentSpec


@dataclass(frozen=True)
class LRSchedule:
    """A piecewise learning-rate schedule over optimizer steps (step 0 is the first update)."""

    init_learning_rate: float
    warmup_learning_rate: float = 0.0
    warmup_steps: int = 0
    learning_rate_steps: Sequence[int] = ()
    learning_rate_decay_levels: Sequence[float] = ()

    def __post_init__(self) -> None:
        if len(self.learning_rate_steps) != len(self.learning_rate_decay_levels):
            raise ValueError(
                "learning_rate_steps and learning_rate_decay_levels must have the same length, "
                f"got {len(self.learning_rate_steps)} and {len(self.learning_rate_decay_levels)}"
            )
        if list(self.learning_rate_steps) != sorted(self.learning_rate_steps):
            raise ValueError(f"learning_rate_steps must increase, got {self.learning_rate_steps}")

    @classmethod
    def from_spec(cls, spec: ExperimentSpec, *, lr_scale: float = 1.0) -> LRSchedule:
        """The spec's schedule with both rates multiplied by ``lr_scale`` (linear scaling)."""
        return cls(
            init_learning_rate=spec.init_learning_rate * lr_scale,
            warmup_learning_rate=spec.warmup_learning_rate * lr_scale,
            warmup_steps=spec.warmup_steps,
            learning_rate_steps=tuple(spec.learning_rate_steps),
            learning_rate_decay_levels=tuple(spec.learning_rate_decay_levels),
        )

    def __call__(self, step: int) -> float:
        """The learning rate used for the update of optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            progress = step / self.warmup_steps
            return (
                self.warmup_learning_rate
                + (self.init_learning_rate - self.warmup_learning_rate) * progress
            )
        passed = bisect.bisect_right(list(self.learning_rate_steps), step)
        if passed == 0:
            return self.init_learning_rate
        return self.init_learning_rate * self.learning_rate_decay_levels[passed - 1]


def apply_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's rate; the schedule is a pure function of the step, so
    resuming needs only the step count (no scheduler state to drift)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
