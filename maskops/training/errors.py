"""Outcomes of a training run other than success."""

from __future__ import annotations

from pathlib import Path


class TrainingError(Exception):
    """A user-facing training failure: one line, naming what is wrong."""


class NonFiniteLossError(TrainingError):
    """The loss became NaN or infinite; nothing from the failing step was saved."""

    def __init__(self, step: int, losses: dict[str, float]) -> None:
        bad = ", ".join(f"{k}={v}" for k, v in losses.items()) or "total loss"
        super().__init__(
            f"non-finite loss at step {step} ({bad}); the last good checkpoint is kept, "
            "try a lower init_learning_rate or a longer warmup"
        )
        self.step = step


class SkippedStepsError(NonFiniteLossError):
    """The fp16 loss scaler skipped too many optimizer steps in a row: the loss or the
    gradients stay non-finite whatever the scale (the run diverged, or fp16 overflows)."""

    def __init__(self, step: int, skipped: int, losses: dict[str, float]) -> None:
        bad = ", ".join(f"{k}={v}" for k, v in losses.items()) or "total loss"
        TrainingError.__init__(
            self,
            f"{skipped} optimizer steps in a row skipped by the fp16 loss scaler (non-finite "
            f"loss or gradients), the last at step {step} ({bad}); the last good checkpoint "
            "is kept, try a lower init_learning_rate or a longer warmup",
        )
        self.step = step
        self.skipped = skipped


class RankFailed(TrainingError):
    """A rank of a torchrun group failed and its restarts are spent (or the hosts of a run
    did not gather): the run failed, not its input. The message is the rank's error."""


class RendezvousFailed(RankFailed):
    """The hosts of a multi-host run did not all join its rendezvous in time: no rank
    started."""


class ProcessGroupError(RuntimeError):
    """A rank could not form its process group in time: the rank fails (and torchrun
    restarts the group) rather than wait for peers that never come."""


class EvaluationAbandoned(Exception):
    """A cancel came during an evaluation: every rank stopped it (between two batches) and
    it published nothing; the run stops at the step boundary that follows."""


class TrainingCancelled(Exception):
    """Training stopped on request at a step boundary; ``checkpoint`` holds that step."""

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        where = f", checkpoint {checkpoint}" if checkpoint else ""
        super().__init__(f"training cancelled at step {step}{where}")
        self.step = step
        self.checkpoint = checkpoint
