"""``_<name>.net``: the exported ONNX graph on onnxruntime (hosts without TensorRT backend).

Inputs: ``images`` FP32 ``[3, H, W]`` per batch item. Outputs per item, padded to D
detections: ``boxes`` FP32 ``[D, 4]``, ``scores`` FP32 ``[D]``, ``labels`` INT64 ``[D]``,
``masks`` FP32 ``[D, M, M]``, ``num_detections`` INT32 ``[1]``. The graph takes a batch
(see maskops.export.graph): the images of all the requests Triton's dynamic batcher hands
over together run as one batch and the rows go back to their requests. A graph of static
batch S (``--static_batch_size``; S = 1 for files exported before batching) runs S images
at a time, the last run filled with zero images. ``MASKOPS_ORT_THREADS`` (or ``threads``
in settings.json) sets onnxruntime's intra-op threads.
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
        first = self.session.get_inputs()[0].shape[0]
        self.static_batch = first if isinstance(first, int) else None

    def execute(self, requests: list[Any]) -> list[Any]:
        per_request = [
            pb_utils.get_input_tensor_by_name(request, ops.NET_INPUT).as_numpy()
            for request in requests
        ]
        images = np.concatenate(per_request).astype(np.float32, copy=False)
        outputs = ops.run_batched(self._run, images, self.static_batch)
        responses = []
        start = 0
        for item in per_request:
            rows = slice(start, start + len(item))
            start += len(item)
            tensors = [
                pb_utils.Tensor(name, np.ascontiguousarray(out[rows]))
                for name, out in zip(self.output_names, outputs, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        outputs: list[np.ndarray] = self.session.run(self.output_names, {ops.NET_INPUT: images})
        return outputs
