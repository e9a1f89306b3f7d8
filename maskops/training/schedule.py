"""The learning-rate schedule of TAO's Mask R-CNN recipe.

TAO's ``step_learning_rate_with_linear_warmup`` (``training/learning_rates.py``), over
0-based optimizer steps (TensorFlow's ``global_step`` during an update: 0 for the first).
While ``step < warmup_steps`` the rate rises linearly from ``warmup_learning_rate`` to
``init_learning_rate``; then TensorFlow's ``piecewise_constant``: after each boundary in
``learning_rate_steps`` (from step ``boundary + 1``; the boundary step keeps the previous
rate) it is ``init_learning_rate * learning_rate_decay_levels[i]``. The levels are absolute
multipliers of the initial rate (0.1, 0.02, 0.002), not successive factors. A boundary
inside the warmup takes effect when the warmup ends, as in TAO.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from maskops.spec.models import ExperimentSpec
from maskops.training.rules import TAO_RULES, TrainingRules


@dataclass(frozen=True)
class LRSchedule:
    """A piecewise learning-rate schedule over optimizer steps (step 0 is the first update)."""

    init_learning_rate: float
    warmup_learning_rate: float = 0.0
    warmup_steps: int = 0
    learning_rate_steps: Sequence[int] = ()
    learning_rate_decay_levels: Sequence[float] = ()
    rate_changes_at_boundary: bool = False
    """True: the boundary step itself takes the new rate (earlier maskops, kept for resuming
    its checkpoints); False: TAO's, from the step after."""

    def __post_init__(self) -> None:
        if len(self.learning_rate_steps) != len(self.learning_rate_decay_levels):
            raise ValueError(
                "learning_rate_steps and learning_rate_decay_levels must have the same length, "
                f"got {len(self.learning_rate_steps)} and {len(self.learning_rate_decay_levels)}"
            )
        if list(self.learning_rate_steps) != sorted(self.learning_rate_steps):
            raise ValueError(f"learning_rate_steps must increase, got {self.learning_rate_steps}")

    @classmethod
    def from_spec(cls, spec: ExperimentSpec, rules: TrainingRules = TAO_RULES) -> LRSchedule:
        """The spec's schedule under ``rules``: TAO's (the rates as written, whatever the
        number of ranks) unless a checkpoint's run started with others."""
        return cls(
            init_learning_rate=spec.init_learning_rate * rules.lr_scale,
            warmup_learning_rate=spec.warmup_learning_rate * rules.lr_scale,
            warmup_steps=spec.warmup_steps,
            learning_rate_steps=tuple(spec.learning_rate_steps),
            learning_rate_decay_levels=tuple(spec.learning_rate_decay_levels),
            rate_changes_at_boundary=rules.rate_changes_at_boundary,
        )

    def __call__(self, step: int) -> float:
        """The learning rate used for the update of optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            progress = step / self.warmup_steps
            return (
                self.warmup_learning_rate
                + (self.init_learning_rate - self.warmup_learning_rate) * progress
            )
        boundaries = list(self.learning_rate_steps)
        if self.rate_changes_at_boundary:
            passed = bisect.bisect_right(boundaries, step)
        else:  # piecewise_constant: boundaries < step
            passed = bisect.bisect_left(boundaries, step)
        if passed == 0:
            return self.init_learning_rate
        return self.init_learning_rate * self.learning_rate_decay_levels[passed - 1]


def apply_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's rate; the schedule is a pure function of the step, so
    resuming needs only the step count (no scheduler state to drift)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
