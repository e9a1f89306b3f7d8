"""``_<name>.preprocess``: encoded image bytes -> resized, padded float image + scale + size.

Inputs (per batch item): ``image_bytes`` BYTES ``[1]``. Outputs: ``images`` FP32
``[3, H, W]`` (RGB 0..1, the graph normalises), ``scale`` FP32 ``[1]``, ``orig_hw`` INT32
``[2]``. A request whose bytes do not decode gets an error naming the problem (the client
turns it into ``InvalidImage``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

# maskops_serving_ops.py is copied next to this file by publish (Triton runs each model in
# its own stub process, so the plain module name cannot collide).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import maskops_serving_ops as ops


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        settings = json.loads((version_dir / "settings.json").read_text())
        self.image_size = (int(settings["image_size"][0]), int(settings["image_size"][1]))

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]

    def _answer(self, request: Any) -> Any:
        encoded = pb_utils.get_input_tensor_by_name(request, ops.IMAGE_BYTES).as_numpy()
        try:
            prepared = [
                ops.preprocess(bytes(item.reshape(-1)[0]), self.image_size, name=f"image {i}")
                for i, item in enumerate(encoded)
            ]
        except ops.ImageDecodeError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        images = np.stack([p[0] for p in prepared]).astype(np.float32)
        scales = np.array([[p[1]] for p in prepared], dtype=np.float32)
        sizes = np.array([p[2] for p in prepared], dtype=np.int32)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor(ops.NET_INPUT, images),
                pb_utils.Tensor(ops.SCALE, scales),
                pb_utils.Tensor(ops.ORIG_HW, sizes),
            ]
        )
