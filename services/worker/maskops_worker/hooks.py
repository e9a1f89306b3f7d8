"""The training hook that connects a run to the control plane: progress, metrics, cancel."""

from __future__ import annotations

import time

from maskops.engine.trainer import HookBase
from maskops_worker.contract import JobContext


class ControlPlaneHook(HookBase):
    """Reports step/total and new metrics (at most every ``min_interval_s``, and at the end)
    and stops the run at the next step boundary once a cancel is requested or the lease is
    lost; the trainer then saves the checkpoint of the last completed step."""

    def __init__(self, ctx: JobContext, *, min_interval_s: float = 1.0) -> None:
        self.ctx = ctx
        self.min_interval_s = min_interval_s
        self._last_report = 0.0
        self._sent: dict[str, float] = {}

    def before_step(self) -> None:
        if self.ctx.stop_event.is_set():
            self.trainer.request_stop("cancelled", cancel=True)

    def _report(self, *, force: bool) -> None:
        trainer = self.trainer
        metrics = dict(trainer.latest_metrics)
        fresh = metrics != self._sent
        if not force and not fresh and time.monotonic() - self._last_report < self.min_interval_s:
            return
        self.ctx.report(trainer.iter, trainer.max_steps, metrics if fresh else None)
        self._sent = metrics
        self._last_report = time.monotonic()

    def before_train(self) -> None:
        self._report(force=True)

    def after_step(self) -> None:
        self._report(force=False)

    def after_train(self) -> None:
        self._report(force=True)


def control_plane_hook(ctx: JobContext) -> ControlPlaneHook:
    return ControlPlaneHook(ctx)
