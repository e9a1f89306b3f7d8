"""The ``export`` action: a model exported to ONNX in the job's folder."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from maskops.options_schema import engine_values
from maskops_core.options import ExportOptions
from maskops_worker.actions.common import (
    inside_data_root,
    job_logger,
    job_options,
    job_spec,
    parent_model,
    relative,
)
from maskops_worker.contract import JobContext


def export(ctx: JobContext) -> dict[str, Any]:
    from maskops.export import export_onnx
    from maskops.export.options import ExportOptions as EngineExportOptions
    from maskops.export.options import export_file_name

    options = job_options(ctx, ExportOptions)
    values = engine_values(EngineExportOptions, options.model_dump())
    # The calibration images are a folder under the data root (the dataclass holds a path).
    if values.get("cal_image_dir") is not None:
        values["cal_image_dir"] = inside_data_root(ctx, values["cal_image_dir"])
    engine_options = EngineExportOptions(**values)
    data_type = engine_options.data_type
    spec = job_spec(ctx, need="")
    out_dir = ctx.work_dir / "export"
    out_dir.mkdir(parents=True, exist_ok=True)
    if data_type == "int8":
        engine_options = replace(engine_options, cal_cache_file=out_dir / "cal.bin")
    source = parent_model(ctx, options)
    result = export_onnx(
        source,
        spec,
        out_dir / export_file_name(source, data_type),
        engine_options,
        log=job_logger(ctx),
    )
    ctx.report(1, 1, {f"{data_type}/{k}": v for k, v in result.metrics.get(data_type, {}).items()})
    return {
        "onnx": relative(ctx, result.onnx_path),
        # What the torch net backend serves when this export is published.
        "source_checkpoint": relative(ctx, source),
        "data_type": result.data_type,
        "report": relative(ctx, result.report_path),
        "mask_ap_drop": result.mask_ap_drop,
        "engine_note": result.engine_note,
    }
