"""What connects a training run to the control plane: progress, metrics and cancel, from a
hook in this process (one rank) or from rank 0's status file (ranks under torchrun)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from maskops.training.trainer import HookBase
from maskops_worker.contract import JobContext


class ProgressReporter:
    """Sends step/total and new metrics to the job: every ``every_steps`` steps (the spec's
    report_frequency, as ``status.json``), or when that is 0 whenever metrics are new and
    else at most every ``min_interval_s``; and always when forced (first and last report)."""

    def __init__(
        self, ctx: JobContext, *, min_interval_s: float = 1.0, every_steps: int = 0
    ) -> None:
        self.ctx = ctx
        self.min_interval_s = min_interval_s
        self.every_steps = every_steps
        self._last_report = 0.0
        self._sent: dict[str, float] = {}

    def _due(self, step: int, fresh: bool) -> bool:
        if self.every_steps > 0:
            return step % self.every_steps == 0
        return fresh or time.monotonic() - self._last_report >= self.min_interval_s

    def report(self, step: int, total: int, metrics: dict[str, float], *, force: bool) -> None:
        fresh = metrics != self._sent
        if not force and not self._due(step, fresh):
            return
        self.ctx.report(step, total, metrics if fresh else None)
        self._sent = dict(metrics)
        self._last_report = time.monotonic()


class ControlPlaneHook(HookBase):
    """Reports progress and metrics and stops the run at the next step boundary once a
    cancel is requested or the lease is lost; the trainer then saves the checkpoint of the
    last completed step."""

    def __init__(
        self, ctx: JobContext, *, min_interval_s: float = 1.0, every_steps: int = 0
    ) -> None:
        self.ctx = ctx
        self.reporter = ProgressReporter(
            ctx, min_interval_s=min_interval_s, every_steps=every_steps
        )

    def before_step(self) -> None:
        if self.ctx.stop_event.is_set():
            self.trainer.request_stop("cancelled", cancel=True)

    def _report(self, *, force: bool) -> None:
        trainer = self.trainer
        self.reporter.report(
            trainer.iter, trainer.max_steps, dict(trainer.latest_metrics), force=force
        )

    def before_train(self) -> None:
        self._report(force=True)

    def after_step(self) -> None:
        self._report(force=False)

    def after_train(self) -> None:
        self._report(force=True)


def control_plane_hook(ctx: JobContext, *, every_steps: int = 0) -> ControlPlaneHook:
    """The hook for a run in this process; ``every_steps`` is the spec's report_frequency."""
    return ControlPlaneHook(ctx, every_steps=every_steps)


def status_reporter(ctx: JobContext) -> Callable[[dict[str, Any]], None]:
    """``on_status`` for :func:`maskops.training.launcher.train_under_torchrun`: rank 0's
    ``status.json`` reported as the hook reports a run in this process (cancel goes the
    other way, through the launcher's cancel file)."""
    reporter = ProgressReporter(ctx)

    def on_status(status: dict[str, Any]) -> None:
        if status.get("total_steps"):
            reporter.report(
                int(status.get("step") or 0),
                int(status["total_steps"]),
                dict(status.get("metrics") or {}),
                force=status.get("state") != "running",
            )

    return on_status
