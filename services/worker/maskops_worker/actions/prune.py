"""The ``prune`` action: low-norm filters removed from a model's backbone and FPN."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maskops.tasks import PRUNE
from maskops_worker.actions.common import declared_job_options, parent_model, relative
from maskops_worker.contract import JobContext


def prune(ctx: JobContext) -> dict[str, Any]:
    from maskops.prune.run import run_prune

    options, engine_options = declared_job_options(ctx, PRUNE)
    out_dir = ctx.work_dir / "pruned"
    report = run_prune(parent_model(ctx, options), out_dir, engine_options)
    ctx.job_log.write(f"params {report.params_before} -> {report.params_after}")
    ctx.report(1, 1, {"params_ratio": report.params_ratio})
    model = Path(report.output_model) if report.output_model else out_dir / "model.pth"
    return {
        "model": relative(ctx, model if model.is_absolute() else out_dir / model),
        "params_before": report.params_before,
        "params_after": report.params_after,
        "macs_before": report.macs_before,
        "macs_after": report.macs_after,
    }
