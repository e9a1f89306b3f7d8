"""A TensorRT engine answers as onnxruntime does on the ONNX it was built from (the same
detections within the data type's tolerances), on a model that detects. Only where
TensorRT and a GPU exist: CI has neither, and bench/gpu_check runs the same comparison."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskops.export import export_onnx
from maskops.export.exporter import read_image_dir
from tests.support.gpu import needs_tensorrt

pytestmark = [pytest.mark.gpu, needs_tensorrt]


@pytest.mark.parametrize("data_type", ["fp16", "int8"])
def test_an_engine_finds_what_onnxruntime_finds_on_its_onnx(
    tmp_path: Path, trained_model, data_type: str
) -> None:  # pragma: no cover - GPU only
    from maskops.export.engine_predictor import engine_parity

    out = tmp_path / f"m_{data_type}.onnx"
    result = export_onnx(
        trained_model.checkpoint,
        trained_model.spec,
        out,
        data_type=data_type,
        max_batch_size=4,
        batches=2,
        batch_size=4,
        evaluate_int8=False,
        engine_file=out.with_suffix(".plan"),
        log=lambda _: None,
    )
    assert result.engine_file is not None, result.engine_note
    images = read_image_dir(trained_model.dataset.train_images, result.metadata.image_size, 8)
    report = engine_parity(result.engine_file, out, images, data_type=data_type)
    assert report.reference_detections > 0
    assert report.passed, report.summary()
