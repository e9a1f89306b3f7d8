"""Export: checkpoint -> validated ONNX (fp32, fp16, int8 QDQ), TensorRT where available.

- :func:`export_onnx` (``maskops export``) and its :class:`ExportResult`; what it makes is
  :class:`~maskops.export.options.ExportOptions`.
- :class:`OnnxPredictor`: runs an exported file with the eager model's call shape
  (``maskops evaluate -m model.onnx`` goes through it).
- :func:`read_metadata`: the spec, label map and precision an exported file carries.

The graph contract (tensor names, shapes, the batch) is documented in
:mod:`maskops.export.graph` (how the batch is made: :mod:`maskops.export.batching`);
tolerances of the parity check in :mod:`maskops.export.parity`; TAO's output layout for
TensorRT and DeepStream (``--engine_file``, ``--gen_ds_config``, ``--output_layout tao``) in
:mod:`maskops.export.tao_layout`, its nvinfer config in :mod:`maskops.export.deepstream`.

Importing this package imports nothing heavy: the names below are imported from their
modules on first use, so that :mod:`maskops.export.options` (standard library only) is what
the control plane imports of the export.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maskops.export.exporter import ExportError, ExportResult, export_onnx
    from maskops.export.graph import INPUT_NAME, OUTPUT_NAMES, GraphMetadata, read_metadata
    from maskops.export.options import DATA_TYPES, ExportOptions
    from maskops.export.parity import TOLERANCES, ParityReport, Tolerances, compare_detections
    from maskops.export.predictor import OnnxPredictor

_HOMES = {
    "ExportError": "exporter",
    "ExportResult": "exporter",
    "export_onnx": "exporter",
    "INPUT_NAME": "graph",
    "OUTPUT_NAMES": "graph",
    "GraphMetadata": "graph",
    "read_metadata": "graph",
    "DATA_TYPES": "options",
    "ExportOptions": "options",
    "TOLERANCES": "parity",
    "ParityReport": "parity",
    "Tolerances": "parity",
    "compare_detections": "parity",
    "OnnxPredictor": "predictor",
}

__all__ = [
    "DATA_TYPES",
    "INPUT_NAME",
    "OUTPUT_NAMES",
    "TOLERANCES",
    "ExportError",
    "ExportOptions",
    "ExportResult",
    "GraphMetadata",
    "OnnxPredictor",
    "ParityReport",
    "Tolerances",
    "compare_detections",
    "export_onnx",
    "read_metadata",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"maskops.export.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
