"""One definition of the export options: the engine's ExportOptions, the ``maskops export``
flags and the REST export job's options agree on names, choices and defaults, and
export_onnx takes the options only through the engine's object."""

from __future__ import annotations

import inspect
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from pydantic import ValidationError

from maskops.cli import export as cli_export
from maskops.export.exporter import default_output_path, export_onnx
from maskops.export.options import DEFAULTS, ExportOptions, cli_flag, export_file_name
from maskops_core.options import ExportOptions as JobExportOptions
from tests.support.options_agreement import TaskCli, literals

BASE = ["export", "-m", "model.pth", "-e", "spec.txt"]
OTHER_VALUES: dict[str, Any] = {
    "data_type": "int8",
    "max_batch_size": 4,
    "static_batch_size": 2,
    "min_batch_size": 1,
    "opt_batch_size": 3,
    "cal_image_dir": Path("calibration"),
    "cal_cache_file": Path("scales.json"),
    "batches": 3,
    "batch_size": 2,
    "engine_file": Path("model.engine"),
    "gen_ds_config": True,
    "output_layout": "tao",
    "opset": 13,
    "workspace_bytes": 1024,
    "strict_types": True,
    "target": "tensorrt",
    "gpu_index": 1,
}
"""A value other than the default for every option."""
CLI = TaskCli(BASE, cli_export.export_options, DEFAULTS, cli_flag, OTHER_VALUES)


def test_the_job_options_are_engine_options_with_the_engine_defaults() -> None:
    job_fields = set(JobExportOptions.model_fields) - set(JobExportOptions.SOURCE_FIELDS)
    engine_types = get_type_hints(ExportOptions)
    assert job_fields <= set(engine_types), job_fields - set(engine_types)
    for name in job_fields:
        job_field = JobExportOptions.model_fields[name]
        assert job_field.default == getattr(DEFAULTS, name), name
        assert literals(job_field.annotation) == literals(engine_types[name]), name
    assert literals(engine_types["data_type"]) == {"fp32", "fp16", "int8"}


def test_a_job_s_options_become_engine_options_unchanged() -> None:
    chosen: dict[str, Any] = {
        "data_type": "int8",
        "max_batch_size": 4,
        "min_batch_size": 1,
        "opt_batch_size": 3,
        "batches": 3,
        "batch_size": 2,
        "output_layout": "tao",
        "gen_ds_config": True,
        "target": "tensorrt",
        "opset": 13,
    }
    job = JobExportOptions.model_validate({"checkpoint": "latest", **chosen})
    given = job.given(exclude={*job.SOURCE_FIELDS, "cal_image_dir"})
    assert replace(DEFAULTS, **given) == replace(DEFAULTS, **chosen)
    assert replace(DEFAULTS, **JobExportOptions.model_validate({}).given()) == DEFAULTS


def test_export_onnx_takes_options_only_through_the_engine_object() -> None:
    parameters = set(inspect.signature(export_onnx).parameters)
    assert "options" in parameters
    assert not parameters & {f.name for f in fields(ExportOptions)}


def test_the_rest_door_holds_the_opset_to_the_engine_s_rule() -> None:
    with pytest.raises(ValidationError, match="opset 11: int8 needs opset 13 or later"):
        JobExportOptions.model_validate({"data_type": "int8", "opset": 11})
    with pytest.raises(ValidationError, match="opset"):
        JobExportOptions.model_validate({"opset": 21})
    bound = JobExportOptions.model_validate({"data_type": "int8", "target": "tensorrt"})
    assert bound.given() == {"data_type": "int8", "target": "tensorrt"}


def test_an_export_file_is_named_after_its_model_and_data_type(tmp_path: Path) -> None:
    """One name for an export's file: ``maskops export``'s default output, and the file an
    export job writes in its folder."""
    model = tmp_path / "results" / "model.step-4.pth"
    assert export_file_name(model, "fp16") == "model.step-4.fp16.onnx"
    assert default_output_path(model, "int8") == model.with_name("model.step-4.int8.onnx")
