"""Reduced-precision variants of the exported graph: fp16 and int8 (QDQ).

fp16 converts the weight layers (Conv, ConvTranspose, Gemm: nearly all of the compute) to
half precision between casts, while anchors, box decoding, NMS and RoIAlign stay fp32 (fp16
has a 1 px step above 1024 px). Tracing a half-precision PyTorch model instead takes
minutes on the CPU (no fast fp16 convolutions there), and the generic ONNX float16
converters (onnxconverter-common's, onnxruntime's copy) produce an invalid graph for this
model when the box arithmetic is blocked (duplicate Cast nodes, mistyped Conv inputs;
measured). The graph's inputs and outputs stay float32.

int8 is onnxruntime's static post-training quantisation in QDQ form (QuantizeLinear /
DequantizeLinear pairs around Conv and Gemm, per-channel symmetric int8 weights, activations
calibrated by min/max over the calibration images), in one of two forms:

- portable (onnxruntime's CPU serving): uint8 activations with an asymmetric range
  (zero point where the data needs it) and int32-quantised biases;
- ``symmetric=True``, bound for TensorRT: int8 activations over a range symmetric about 0,
  every zero point 0 and float biases. TensorRT's Q/DQ import takes INT8 with zero point 0
  only (``tensorrt_onnx_support.json``: QuantizeLinear, DequantizeLinear), and reads the
  scales from the graph, so no separate calibration step is needed.
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from maskops.atomic import atomic_write
from maskops.export.graph import INPUT_NAME, used_names
from maskops.progress import Progress

CALIBRATION_CACHE_FORMAT = "maskops-int8-calibration/1"
QUANTIZED_OP_TYPES: tuple[str, ...] = ("Conv", "Gemm")


FP16_OP_TYPES: tuple[str, ...] = ("Conv", "ConvTranspose", "Gemm")


def convert_to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Run the graph's Conv/ConvTranspose/Gemm layers in float16 (weights stored as fp16).

    Each converted layer reads its input through a Cast to fp16 and writes through a Cast
    back to fp32, so everything else (anchors, box decoding, NMS, RoIAlign) stays fp32 and
    the graph's inputs and outputs keep their types. Back-to-back casts between layers
    are folded by onnxruntime's and TensorRT's optimisers.
    """
    model = copy.deepcopy(model)
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    half_names: set[str] = set()
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        params = [name for name in node.input[1:] if name]
        if node.op_type not in FP16_OP_TYPES or not all(p in weights for p in params):
            nodes.append(node)
            continue
        for position, name in enumerate(node.input[1:], start=1):
            if not name:
                continue
            half = f"{name}__fp16"
            if half not in half_names:
                array = numpy_helper.to_array(weights[name]).astype(np.float16)
                graph.initializer.append(numpy_helper.from_array(array, half))
                half_names.add(half)
            node.input[position] = half
        source, result = node.input[0], node.output[0]
        node.input[0], node.output[0] = f"{source}__fp16_in_{node.name}", f"{result}__fp16"
        nodes.append(
            helper.make_node(
                "Cast",
                [source],
                [node.input[0]],
                name=f"{node.name}/to_fp16",
                to=onnx.TensorProto.FLOAT16,
            )
        )
        nodes.append(node)
        nodes.append(
            helper.make_node(
                "Cast",
                [node.output[0]],
                [result],
                name=f"{node.name}/to_fp32",
                to=onnx.TensorProto.FLOAT,
            )
        )
    del graph.node[:]
    graph.node.extend(nodes)
    # fp32 weights that only the converted layers read are dropped (halving the file).
    used = used_names(graph)
    kept = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


_PORTABLE_OPTIONS: dict[str, object] = {"CalibTensorRangeSymmetric": False}
_SYMMETRIC_OPTIONS: dict[str, object] = {
    "CalibTensorRangeSymmetric": True,
    "ActivationSymmetric": True,
    "WeightSymmetric": True,
    # onnxruntime quantises biases to int32 behind a DequantizeLinear; TensorRT's
    # DequantizeLinear takes INT8 (FP8, INT4) only.
    "QuantizeBias": False,
}


class _ImageReader:
    """onnxruntime CalibrationDataReader over ``[3, H, W]`` float images, one per call.

    onnxruntime asks for the next image once it has run the one before, so that is when
    ``progress`` counts an image done.
    """

    def __init__(self, images: Iterable[torch.Tensor], progress: Progress | None = None) -> None:
        self._images: Iterator[torch.Tensor] = iter(images)
        self._progress = progress
        self._running = False

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._running and self._progress is not None:
            self._progress.update(1)
        image = next(self._images, None)
        self._running = image is not None
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
    symmetric: bool = False,
    progress: Progress | None = None,
) -> tuple[onnx.ModelProto, dict[str, dict[str, float]]]:
    """Statically quantise an fp32 graph to int8 QDQ, calibrated on ``calibration_images``.

    Args:
        fp32_model: the fp32 export (graph contract of :mod:`maskops.export.graph`).
        calibration_images: ``[3, H, W]`` float images in 0..1, already resized and padded
            exactly as at inference.
        work_dir: where onnxruntime's temporary files go (default: the system's).
        symmetric: the TensorRT form (int8 activations, zero points 0, float biases)
            instead of the portable one (uint8 activations, asymmetric); see the module.
        progress: advanced by one as each calibration image has run.

    Returns:
        (the QDQ model, the calibration table: tensor name -> {"scale", "zero_point"} of
        each quantised activation).
    """
    from onnxruntime.quantization import (
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
            _ImageReader(calibration_images, progress),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTIZED_OP_TYPES),
            per_channel=True,
            activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options=_SYMMETRIC_OPTIONS if symmetric else _PORTABLE_OPTIONS,
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
        scale = numpy_helper.to_array(constants[node.input[1]])
        zero = numpy_helper.to_array(constants[node.input[2]]) if len(node.input) > 2 else 0
        table[node.input[0]] = {
            "scale": float(np.ravel(scale)[0]),
            "zero_point": int(np.ravel(zero)[0]),
        }
    return table


def write_calibration_cache(
    path: Path,
    table: dict[str, dict[str, float]],
    *,
    num_images: int,
    source: str,
    symmetric: bool = False,
) -> None:
    """Write the calibration scales as JSON (scale/zero point per activation tensor)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": CALIBRATION_CACHE_FORMAT,
        "method": "minmax",
        "activation_type": "int8 symmetric" if symmetric else "uint8",
        "weight_type": "int8 per-channel",
        "num_images": num_images,
        "source": source,
        "tensors": table,
    }
    atomic_write(path, json.dumps(payload, indent=1, sort_keys=True))
