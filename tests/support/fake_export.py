"""A maskops-tagged ONNX file for publishing tests (publishing never runs the graph)."""

from __future__ import annotations

from pathlib import Path

import onnx

from maskops.data.labels import LabelMap
from maskops.export.graph import GraphMetadata, set_metadata
from maskops.spec.models import ExperimentSpec

LABELS = LabelMap.from_coco_categories([{"id": 3, "name": "square"}, {"id": 7, "name": "tri"}])


def fake_onnx_export(
    path: Path,
    batch: int | str,
    *,
    data_type: str = "fp16",
    max_batch_size: int = 3,
    output_layout: str = "maskops",
    zero_point: int | None = None,
) -> Path:
    """An Identity graph with the metadata of an export and input [batch, 3, 64, 96]; with
    ``zero_point``, a QuantizeLinear/DequantizeLinear pair instead, its zero point that
    number as int8 (-128..127) or uint8 (128..255), as an int8 export's activations."""
    shape = [batch, 3, 64, 96]
    nodes = [onnx.helper.make_node("Identity", ["images"], ["boxes"])]
    constants = []
    if zero_point is not None:
        zero_type = onnx.TensorProto.INT8 if zero_point < 128 else onnx.TensorProto.UINT8
        constants = [
            onnx.helper.make_tensor("scale", onnx.TensorProto.FLOAT, [], [0.05]),
            onnx.helper.make_tensor("zero", zero_type, [], [zero_point]),
        ]
        nodes = [
            onnx.helper.make_node("QuantizeLinear", ["images", "scale", "zero"], ["q"]),
            onnx.helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["boxes"]),
        ]
    graph = onnx.helper.make_graph(
        nodes,
        "g",
        [onnx.helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT, shape)],
        [onnx.helper.make_tensor_value_info("boxes", onnx.TensorProto.FLOAT, shape)],
        initializer=constants,
    )
    # An IR version and opset every onnxruntime of the lock loads (tests start sessions on it).
    model = onnx.helper.make_model(
        graph, ir_version=8, opset_imports=[onnx.helper.make_opsetid("", 17)]
    )
    set_metadata(
        model,
        GraphMetadata(
            spec=ExperimentSpec(),
            label_map=LABELS,
            data_type=data_type,
            image_size=(64, 96),
            max_detections=7,
            mask_resolution=14,
            max_batch_size=max_batch_size,
            output_layout=output_layout,
        ),
    )
    onnx.save(model, str(path))
    return path


def fake_engine(
    onnx_path: Path,
    *,
    tensorrt_version: str = "10.7.0.23",
    profile: tuple[int, int, int] = (1, 3, 3),
    data_type: str = "fp16",
) -> Path:
    """``<onnx stem>.engine`` (bytes standing for a plan: publishing never loads it) with the
    record ``maskops gen_trt_engine`` writes next to an engine it built."""
    from maskops.serving.engines import write_engine_record

    engine = onnx_path.with_suffix(".engine")
    engine.write_bytes(b"plan bytes")
    write_engine_record(
        engine,
        onnx_path=onnx_path,
        data_type=data_type,
        image_size=(64, 96),
        profile=profile,
        tensorrt_version=tensorrt_version,
        gpu="test GPU (sm_90)",
    )
    return engine
