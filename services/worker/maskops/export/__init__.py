"""Export: checkpoint -> validated ONNX (fp32, fp16, int8 QDQ), TensorRT where available.

- :func:`export_onnx` (``maskops export``) and its :class:`ExportResult`.
- :class:`OnnxPredictor`: runs an exported file with the eager model's call shape
  (``maskops evaluate -m model.onnx`` goes through it).
- :func:`read_metadata`: the spec, label map and precision an exported file carries.

The graph contract (tensor names, shapes, the batch) is documented in
:mod:`maskops.export.graph` (how the batch is made: :mod:`maskops.export.batching`);
tolerances of the parity check in :mod:`maskops.export.parity`; TAO's output layout for
TensorRT and DeepStream (``--engine_file``, ``--gen_ds_config``, ``--output_layout tao``) in
:mod:`maskops.export.tao_layout`, its nvinfer config in :mod:`maskops.export.deepstream`.
"""

from maskops.export.exporter import DATA_TYPES, ExportError, ExportResult, export_onnx
from maskops.export.graph import INPUT_NAME, OUTPUT_NAMES, GraphMetadata, read_metadata
from maskops.export.parity import TOLERANCES, ParityReport, Tolerances, compare_detections
from maskops.export.predictor import OnnxPredictor

__all__ = [
    "DATA_TYPES",
    "INPUT_NAME",
    "OUTPUT_NAMES",
    "TOLERANCES",
    "ExportError",
    "ExportResult",
    "GraphMetadata",
    "OnnxPredictor",
    "ParityReport",
    "Tolerances",
    "compare_detections",
    "export_onnx",
    "read_metadata",
]
