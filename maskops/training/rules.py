"""How a run reads the spec's training fields: TAO 5.3's meaning, or, for a checkpoint
written by an earlier maskops, the meaning its run started with.

TAO's Mask R-CNN (``nvidia_tao_tf1/cv/mask_rcnn``) uses the rates as written whatever the
number of GPUs, counts ``num_epochs`` in steps of one GPU (``num_examples_per_epoch`` is
per GPU), penalises ``l1_weight_decay / 2 * sum(|w|)``, moves to the next rate after a
``learning_rate_steps`` boundary (TensorFlow's ``piecewise_constant``) and applies both
weight decays when retraining a pruned model. Earlier maskops versions read these fields
otherwise; a checkpoint they wrote holds no rules, only the ``lr_scale`` it trained with,
and resumes with :data:`earlier` rules so that the run ends as it would have.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class TrainingRules:
    """The meaning of the spec's training fields for one run (the defaults: TAO's)."""

    lr_scale: float = 1.0
    """``init_learning_rate`` and ``warmup_learning_rate`` are multiplied by this."""
    epoch_steps_divisor: int = 1
    """The steps ``num_epochs`` gives are divided by this (besides accumulate_grad_steps)."""
    l1_factor: float = 0.5
    """The L1 penalty is ``l1_weight_decay * l1_factor * sum(|w|)``."""
    rate_changes_at_boundary: bool = False
    """False (TAO): the step numbered ``learning_rate_steps[i]`` (0-based, TensorFlow's
    ``global_step`` during that update) still uses the previous rate; True: it uses the new."""
    pruned_weight_decay: bool = True
    """Whether ``l1_weight_decay`` and ``l2_weight_decay`` apply with ``pruned_model_path``."""

    def to_state(self) -> dict[str, Any]:
        """The rules as a checkpoint stores them."""
        return asdict(self)

    @classmethod
    def from_checkpoint(cls, scheduler: Mapping[str, Any] | None) -> TrainingRules:
        """The rules a checkpoint's run started with, from its ``scheduler`` state.

        Raises:
            ValueError: the checkpoint names rules this version does not know.
        """
        if scheduler is None:
            return earlier(1.0)
        if "rules" not in scheduler:
            return earlier(float(scheduler.get("lr_scale", 1.0)))
        stored = dict(scheduler["rules"])
        unknown = sorted(set(stored) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"it was trained with rules this maskops does not know: {unknown}")
        return cls(**stored)

    def describe_changes(self) -> list[str]:
        """How these rules differ from TAO's, in words (empty for TAO's)."""
        changes = []
        if self.lr_scale != TAO_RULES.lr_scale:
            changes.append(f"learning rates x{self.lr_scale:g}")
        if self.epoch_steps_divisor != TAO_RULES.epoch_steps_divisor:
            changes.append(f"num_epochs' steps / {self.epoch_steps_divisor}")
        if self.l1_factor != TAO_RULES.l1_factor:
            changes.append(f"L1 penalty {self.l1_factor:g} x l1_weight_decay x sum(|w|)")
        if self.rate_changes_at_boundary != TAO_RULES.rate_changes_at_boundary:
            changes.append("new rate at each learning_rate_steps boundary step")
        if self.pruned_weight_decay != TAO_RULES.pruned_weight_decay:
            changes.append("no weight decay when retraining a pruned model")
        return changes


TAO_RULES = TrainingRules()
"""TAO 5.3's meaning: what every new run uses."""


def earlier(lr_scale: float) -> TrainingRules:
    """The rules of maskops before it followed TAO on these fields, for a checkpoint that
    stored ``lr_scale`` (the number of ranks its run started on)."""
    return TrainingRules(
        lr_scale=lr_scale,
        epoch_steps_divisor=max(1, round(lr_scale)),
        l1_factor=1.0,
        rate_changes_at_boundary=True,
        pruned_weight_decay=False,
    )
