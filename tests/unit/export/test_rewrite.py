"""The export-time rewrite of the mask predictor: same outputs, no ConvTranspose in the graph."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from maskops.export.graph import trace_to_onnx
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
