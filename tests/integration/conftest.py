"""Fixtures shared by the integration tests of Triton serving."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskops.spec.models import ExperimentSpec


@pytest.fixture(scope="session")
def exported(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path, tiny_spec: ExperimentSpec
) -> Path:
    """``tiny_checkpoint`` exported as fp32 ONNX (batch up to 4), for publishing."""
    from maskops.export import export_onnx

    out = tmp_path_factory.mktemp("triton_export") / "shapes.onnx"
    return export_onnx(
        tiny_checkpoint, tiny_spec, out, max_batch_size=4, log=lambda _: None
    ).onnx_path
