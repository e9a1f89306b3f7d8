"""The export-time rewrite of the mask predictor: same outputs, no ConvTranspose in the graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from maskops.export.graph import OPSET, trace_to_onnx
from maskops.export.rewrite import SubpixelMaskPredictor, is_subpixel_predictor, rewrite_for_export
from maskops.modeling import build_model
from maskops.modeling.heads import Float32MaskRCNNPredictor
from maskops.spec.models import ExperimentSpec


@pytest.mark.parametrize("stride", [2, 3])
def test_subpixel_predictor_equals_the_transposed_conv_predictor(stride: int) -> None:
    torch.manual_seed(0)
    source = Float32MaskRCNNPredictor(16, 12, 5)
    source.conv5_mask = nn.ConvTranspose2d(16, 12, stride, stride=stride)
    for param in source.parameters():  # biases and logits away from their zero init
        nn.init.normal_(param)
    features = torch.randn(7, 16, 14, 10)
    expected = source(features)
    got = SubpixelMaskPredictor(source)(features)
    assert got.shape == expected.shape == (7, 5, 14 * stride, 10 * stride)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert SubpixelMaskPredictor(source)(features[:0]).shape == (0, 5, 14 * stride, 10 * stride)


def test_subpixel_predictor_runs_in_onnxruntime_with_and_without_rois(tmp_path: Path) -> None:
    torch.manual_seed(0)
    predictor = SubpixelMaskPredictor(Float32MaskRCNNPredictor(16, 12, 5)).eval()
    path = tmp_path / "predictor.onnx"
    with torch.no_grad():
        torch.onnx.export(
            predictor,
            (torch.randn(3, 16, 7, 7),),
            str(path),
            dynamo=False,
            opset_version=OPSET,
            input_names=["features"],
            output_names=["logits"],
            dynamic_axes={"features": {0: "rois"}, "logits": {0: "rois"}},
        )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for rois in (0, 1, 4):  # an image without detections has no RoIs
        features = torch.randn(rois, 16, 7, 7)
        (got,) = session.run(None, {"features": features.numpy()})
        expected = predictor(features).detach().numpy()
        assert got.shape == expected.shape == (rois, 5, 14, 14)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_predictors_of_another_form_are_left_alone() -> None:
    padded = Float32MaskRCNNPredictor(16, 12, 5)
    padded.conv5_mask = nn.ConvTranspose2d(16, 12, 3, stride=2, padding=1)
    assert not is_subpixel_predictor(padded)
    with pytest.raises(ValueError, match="not a transposed-conv"):
        SubpixelMaskPredictor(padded)


def test_the_traced_copy_is_rewritten_and_the_model_is_not(tiny_spec: ExperimentSpec) -> None:
    size = tiny_spec.data_config.image_size
    model = build_model(tiny_spec.maskrcnn_config, num_classes=4, image_size=size).eval()
    rewritten = rewrite_for_export(model).get_submodule("roi_heads.mask_predictor")
    original = model.get_submodule("roi_heads.mask_predictor")
    assert isinstance(rewritten, SubpixelMaskPredictor)
    assert isinstance(original, Float32MaskRCNNPredictor)
    features = torch.randn(3, 256, 14, 14)
    torch.testing.assert_close(
        rewritten(features),
        original(features),
        rtol=1e-4,
        atol=1e-4,
    )
    graph = trace_to_onnx(model, image_size=size, max_detections=20)
    ops = {node.op_type for node in graph.graph.node}
    assert "ConvTranspose" not in ops and "DepthToSpace" in ops
    # Equal biases are stored once by the exporter; every layer still reads an initializer.
    initializers = {init.name for init in graph.graph.initializer}
    convs = [node for node in graph.graph.node if node.op_type == "Conv"]
    assert all(name in initializers for node in convs for name in node.input[1:])
