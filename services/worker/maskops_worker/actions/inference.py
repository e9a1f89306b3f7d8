"""The ``inference`` action: a model run over a folder of images; annotated images, COCO
JSON and, if asked, the labelling tools' files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from maskops.tasks import INFERENCE
from maskops_worker.actions.common import (
    declared_job_options,
    inside_data_root,
    job_logger,
    job_spec,
    parent_model,
    relative,
)
from maskops_worker.contract import JobContext, JobInputError

if TYPE_CHECKING:
    from maskops.evaluation.inference_options import InferenceOptions


def inference(ctx: JobContext) -> dict[str, Any]:
    from maskops.evaluation.inference import run_inference

    spec = job_spec(ctx, need="")
    options, engine_options = declared_job_options(ctx, INFERENCE)
    if options.image_dir is not None:
        image_dir = inside_data_root(ctx, options.image_dir)
    elif ctx.job.dataset_splits and "val" in ctx.job.dataset_splits:
        image_dir = ctx.data_path(ctx.job.dataset_splits["val"]["image_dir"])
    else:
        raise JobInputError("inference needs options.image_dir (relative to the data root)")
    out_images, labels = ctx.work_dir / "images", ctx.work_dir / "labels"
    summary = run_inference(
        spec,
        parent_model(ctx, options),
        image_dir,
        out_images,
        engine_options,
        label_dir=labels,
        progress=False,
        log=job_logger(ctx),
        warn=job_logger(ctx),
    )
    ctx.report(summary.images, summary.images)
    result: dict[str, Any] = {
        "images": summary.images,
        "detections": summary.detections,
        "skipped": [f"{p.name}: {why}" for p, why in summary.skipped],
        "annotated_images": relative(ctx, out_images),
        "labels": relative(ctx, labels),
    }
    if engine_options.exports and summary.images:
        result["exports"] = _export_predictions(ctx, engine_options, labels)
    return result


def _export_predictions(ctx: JobContext, options: InferenceOptions, labels: Path) -> list[str]:
    """The predictions as the labelling tools' files (``options.exports``), under exports/."""
    from maskops.data.formats.predictions import export_predictions

    parent = ctx.job.parent_job_id
    version = options.model_version or (f"job-{parent}" if parent else "maskops")
    written = export_predictions(
        labels,
        ctx.work_dir / "exports",
        list(options.exports),
        tolerance=options.polygon_tolerance,
        model_version=version,
    )
    return [relative(ctx, path) for path in written]
