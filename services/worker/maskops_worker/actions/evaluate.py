"""The ``evaluate`` action: COCO metrics of a model on the experiment's validation data."""

from __future__ import annotations

from typing import Any

from maskops.tasks import EVALUATE
from maskops_worker.actions.common import (
    declared_job_options,
    job_logger,
    job_spec,
    parent_model,
    relative,
)
from maskops_worker.contract import JobContext


def evaluate(ctx: JobContext) -> dict[str, Any]:
    from maskops.evaluation.runner import run_evaluation

    spec = job_spec(ctx, need="validation_file_pattern")
    options, engine_options = declared_job_options(ctx, EVALUATE)
    model = parent_model(ctx, options)
    report = ctx.work_dir / "metrics.json"
    metrics = run_evaluation(
        spec, model, engine_options, out_json=report, progress=False, log=job_logger(ctx)
    )
    ctx.report(1, 1, metrics)
    return {"metrics": metrics, "model": relative(ctx, model), "report": relative(ctx, report)}
