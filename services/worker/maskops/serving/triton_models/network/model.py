"""``_<name>.net``: the exported ONNX graph on onnxruntime (hosts without TensorRT backend).

Inputs: ``images`` FP32 ``[3, H, W]`` per batch item. Outputs per item, padded to D
detections: ``boxes`` FP32 ``[D, 4]``, ``scores`` FP32 ``[D]``, ``labels`` INT64 ``[D]``,
``masks`` FP32 ``[D, M, M]``, ``num_detections`` INT32 ``[1]``. The graph serves one image
per run (see maskops.export.graph), so a dynamic batch runs it once per image.
``MASKOPS_ORT_THREADS`` (or ``threads`` in settings.json) sets onnxruntime's intra-op
threads.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

# maskops_serving_ops.py is copied next to this file by publish (Triton runs each model in
# its own stub process, so the plain module name cannot collide).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import maskops_serving_ops as ops


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        settings = json.loads((version_dir / "settings.json").read_text())
        threads = int(os.environ.get("MASKOPS_ORT_THREADS", "0")) or settings.get("threads")
        # The engine's session options (maskops.export.predictor.session_options).
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = int(threads)
        self.session = ort.InferenceSession(
            str(version_dir / "model.onnx"),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self.output_names = list(ops.NET_OUTPUTS)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, ops.NET_INPUT).as_numpy()
            runs = [
                self.session.run(
                    self.output_names, {ops.NET_INPUT: np.ascontiguousarray(image[None])}
                )
                for image in images
            ]
            tensors = [
                pb_utils.Tensor(name, np.concatenate([run[i] for run in runs], axis=0))
                for i, name in enumerate(self.output_names)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
