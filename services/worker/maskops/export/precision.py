"""Reduced-precision variants of the exported graph: fp16 and int8 (QDQ).

fp16 is made in PyTorch before tracing: the convolutional parts (backbone + FPN, RPN head,
box head and predictor, mask head and predictor) run in half precision between casts,
while anchors, box decoding, NMS and RoIAlign stay fp32. Generic ONNX float16 converters
(onnxconverter-common's, onnxruntime's copy of it) would either convert the box arithmetic
too (fp16 has a 1 px step above 1024 px) or, with a node block list, produce duplicate
Cast names on this graph (measured). The graph's inputs and outputs stay float32.

int8 is onnxruntime's static post-training quantisation in QDQ form (QuantizeLinear /
DequantizeLinear pairs around Conv and Gemm: per-channel symmetric int8 weights, uint8
activations calibrated by min/max over the calibration images). onnxruntime runs QDQ here;
TensorRT reads the same Q/DQ scales directly, so no separate calibration step is needed.
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from maskops.export.graph import INPUT_NAME

CALIBRATION_CACHE_FORMAT = "maskops-int8-calibration/1"
QUANTIZED_OP_TYPES: tuple[str, ...] = ("Conv", "Gemm")


def _cast_tree(value: Any, dtype: torch.dtype) -> Any:
    """Cast every floating tensor in a (nested) tuple/list/dict to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return type(value)((k, _cast_tree(v, dtype)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_cast_tree(v, dtype) for v in value)
    return value


class HalfPrecision(nn.Module):
    """Runs ``module`` in float16; inputs are cast in and outputs back to float32."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module.half()

    def forward(self, *args: Any) -> Any:
        return _cast_tree(self.module(*_cast_tree(args, torch.float16)), torch.float32)


HALF_SUBMODULES: tuple[str, ...] = (
    "backbone",
    "rpn.head",
    "roi_heads.box_head",
    "roi_heads.box_predictor",
    "roi_heads.mask_head",
    "roi_heads.mask_predictor",
)


def half_precision_copy(model: nn.Module) -> nn.Module:
    """A copy of a Mask R-CNN whose convolutional submodules run in fp16 (see module doc)."""
    model = copy.deepcopy(model).eval()
    for dotted in HALF_SUBMODULES:
        parent_path, _, name = dotted.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        child = getattr(parent, name, None)
        if child is None:
            continue
        setattr(parent, name, HalfPrecision(child))
    return model


class _ImageReader:
    """onnxruntime CalibrationDataReader over ``[3, H, W]`` float images, one per call."""

    def __init__(self, images: Iterable[torch.Tensor]) -> None:
        self._images: Iterator[torch.Tensor] = iter(images)

    def get_next(self) -> dict[str, np.ndarray] | None:
        image = next(self._images, None)
        if image is None:
            return None
        return {INPUT_NAME: image[None].numpy().astype(np.float32)}

    def rewind(self) -> None:  # pragma: no cover - onnxruntime calls it only for some methods
        raise NotImplementedError("calibration images are read once")


def quantize_int8(
    fp32_model: onnx.ModelProto,
    calibration_images: Sequence[torch.Tensor],
    *,
    work_dir: Path | None = None,
) -> tuple[onnx.ModelProto, dict[str, dict[str, float]]]:
    """Statically quantise an fp32 graph to int8 QDQ, calibrated on ``calibration_images``.

    Args:
        fp32_model: the fp32 export (graph contract of :mod:`maskops.export.graph`).
        calibration_images: ``[3, H, W]`` float images in 0..1, already resized and padded
            exactly as at inference.

    Returns:
        (the QDQ model, the calibration table: tensor name -> {"scale", "zero_point"} of
        each quantised activation).
    """
    from onnxruntime.quantization import (  # noqa: PLC0415  (heavy, only for int8)
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    if not calibration_images:
        raise ValueError("int8 calibration needs at least one image")
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="maskops-int8-") as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(fp32_model, str(src))
        quantize_static(
            str(src),
            str(dst),
            _ImageReader(calibration_images),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTIZED_OP_TYPES),
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"CalibTensorRangeSymmetric": False},
        )
        quantized = onnx.load(str(dst))
    return quantized, calibration_table(quantized)


def calibration_table(model: onnx.ModelProto) -> dict[str, dict[str, float]]:
    """Activation scales of a QDQ model: the QuantizeLinear inputs that are not weights."""
    constants = {init.name: init for init in model.graph.initializer}
    table: dict[str, dict[str, float]] = {}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in constants:
            continue
        scale = onnx.numpy_helper.to_array(constants[node.input[1]])
        zero = onnx.numpy_helper.to_array(constants[node.input[2]]) if len(node.input) > 2 else 0
        table[node.input[0]] = {"scale": float(np.ravel(scale)[0]), "zero_point": int(np.ravel(zero)[0])}
    return table


def write_calibration_cache(
    path: Path, table: dict[str, dict[str, float]], *, num_images: int, source: str
) -> None:
    """Write the calibration scales as JSON (scale/zero point per activation tensor)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": CALIBRATION_CACHE_FORMAT,
        "method": "minmax",
        "activation_type": "uint8",
        "weight_type": "int8 per-channel",
        "num_images": num_images,
        "source": source,
        "tensors": table,
    }
    path.write_text(json.dumps(payload, indent=1, sort_keys=True))
