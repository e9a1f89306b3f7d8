"""The ``dataset_convert`` action: a registered dataset's splits converted into shards."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from maskops.data.convert_options import DEFAULT_FORMAT, ConvertOptions
from maskops_core import job_state
from maskops_worker.contract import JobCancelled, JobContext, JobInputError

MAX_LISTED_WARNINGS = 100
"""Findings listed on the dataset per split; the full list stays in the warnings file."""


def dataset_convert(ctx: JobContext) -> dict[str, Any]:
    from maskops.data.formats import coco_path, convert_labelled_dataset

    job = ctx.job
    if job.dataset_id is None or not job.dataset_splits:
        raise JobInputError("dataset_convert needs a dataset_id")
    root = ctx.settings.data_root
    out_dir = root / "datasets" / str(job.dataset_id) / "shards"
    counts: dict[str, Any] = {}
    warnings: list[Any] = []
    label_map: list[Any] = []
    splits = list(job.dataset_splits.items())
    for index, (split, paths) in enumerate(splits):
        if ctx.cancel_requested:
            raise JobCancelled()
        format_name = paths.get("format", DEFAULT_FORMAT)
        # The job's last line says what it was doing should its process die mid-conversion.
        ctx.job_log.write(
            f"converting {split}: {format_name} annotations {paths['annotation_file']}, "
            f"images {paths['image_dir']}"
        )
        result = convert_labelled_dataset(
            ctx.input_path(paths["image_dir"], f"the {split} images"),
            ctx.input_path(paths["annotation_file"], f"the {split} annotations"),
            out_dir,
            split_options(ctx, split, paths),
            progress=_split_progress(ctx, index, len(splits)),
        )
        ctx.job_log.write(result.summary())
        counts[split] = {
            "images": result.num_images,
            "skipped_images": result.num_skipped_images,
            "annotations": result.num_annotations,
            "crowd": result.num_crowd,
            "dropped_annotations": result.num_dropped_annotations,
            "shards": len(result.shards),
            "per_category": {str(k): v for k, v in result.category_counts.items()},
        }
        if format_name != DEFAULT_FORMAT:
            counts[split]["coco_file"] = str(coco_path(out_dir, split).relative_to(root))
        label_map = label_map or result.label_map.to_json()
        findings = json.loads(result.warnings_path.read_text())
        warnings.append(
            {
                "split": split,
                "counts": result.warning_counts,
                "file": str(result.warnings_path.relative_to(root)),
                "images": dict(list(findings.items())[:MAX_LISTED_WARNINGS]),
            }
        )
    relative_out = str(out_dir.relative_to(root))
    job_state.record_dataset(
        ctx.factory,
        job.dataset_id,
        shards_dir=relative_out,
        counts=counts,
        label_map=label_map,
        warnings=warnings,
    )
    return {"shards_dir": relative_out, "counts": {k: v["images"] for k, v in counts.items()}}


def split_options(ctx: JobContext, split: str, paths: dict[str, Any]) -> ConvertOptions:
    """The engine's options converting one split of the job's dataset."""
    labels = paths.get("labels")
    return ConvertOptions(
        format_name=paths.get("format", DEFAULT_FORMAT),
        labels=tuple(labels) if labels is not None else None,
        tag=split,
        num_shards=ctx.job.dataset_num_shards,
        include_masks=ctx.job.dataset_include_masks,
        # No process pool: forking a process that runs a heartbeat thread can copy a held
        # lock into the children and hang them. CPU workers scale by Celery concurrency.
        workers=1,
    )


def _split_progress(ctx: JobContext, index: int, num_splits: int) -> Callable[[int, int], None]:
    """Progress of split ``index`` as a share of the whole job, in thousandths."""

    def report(done: int, total: int) -> None:
        ctx.report(index * 1000 + int(1000 * done / max(total, 1)), 1000 * num_splits)

    return report
