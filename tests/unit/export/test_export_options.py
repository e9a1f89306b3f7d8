"""The export options: a job's options become the engine's ExportOptions unchanged, the REST
door holds the opset to the engine's rule, and export_onnx takes the options only through
the engine's object."""

from __future__ import annotations

import inspect
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from maskops.export.exporter import default_output_path, export_onnx
from maskops.export.options import DEFAULTS, ExportOptions, export_file_name
from maskops_core.options import ExportOptions as JobExportOptions


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
