"""``<name>_net``: the exported ONNX graph on onnxruntime (hosts without TensorRT backend).

Inputs: ``images`` FP32 ``[3, H, W]`` per batch item. Outputs per item, padded to D
detections: ``boxes`` FP32 ``[D, 4]``, ``scores`` FP32 ``[D]``, ``labels`` INT64 ``[D]``,
``masks`` FP32 ``[D, M, M]``, ``num_detections`` INT32 ``[1]``. The graph serves one image
per run (see maskops.export.graph), so a dynamic batch runs it once per image.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

from maskops.export.graph import INPUT_NAME, OUTPUT_NAMES
from maskops.export.predictor import session_options


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        settings = json.loads((version_dir / "settings.json").read_text())
        threads = int(os.environ.get("MASKOPS_ORT_THREADS", "0")) or settings.get("threads")
        self.session = ort.InferenceSession(
            str(version_dir / "model.onnx"),
            sess_options=session_options(threads=threads),
            providers=["CPUExecutionProvider"],
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, INPUT_NAME).as_numpy()
            runs = [
                self.session.run(
                    list(OUTPUT_NAMES), {INPUT_NAME: np.ascontiguousarray(image[None])}
                )
                for image in images
            ]
            tensors = [
                pb_utils.Tensor(name, np.concatenate([run[i] for run in runs], axis=0))
                for i, name in enumerate(OUTPUT_NAMES)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
