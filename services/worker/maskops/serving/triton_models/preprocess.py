"""``<name>_preprocess``: encoded image bytes -> resized, padded float image + scale + size.

Inputs (per batch item): ``image_bytes`` BYTES ``[1]``. Outputs: ``images`` FP32
``[3, H, W]`` (0..1, the graph normalises), ``scale`` FP32 ``[1]``, ``orig_hw`` INT32
``[2]``. A request whose bytes do not decode gets an error naming the problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from maskops.evaluation.errors import ImageReadError
from maskops.serving.processing import preprocess_image


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        settings = json.loads((version_dir / "settings.json").read_text())
        self.image_size = (int(settings["image_size"][0]), int(settings["image_size"][1]))

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            encoded = pb_utils.get_input_tensor_by_name(request, "image_bytes").as_numpy()
            try:
                prepared = [
                    preprocess_image(bytes(item.reshape(-1)[0]), self.image_size, name=f"image {i}")
                    for i, item in enumerate(encoded)
                ]
            except ImageReadError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                continue
            images = np.stack([p[0] for p in prepared]).astype(np.float32)
            scales = np.array([[p[1]] for p in prepared], dtype=np.float32)
            sizes = np.array([p[2] for p in prepared], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("images", images),
                        pb_utils.Tensor("scale", scales),
                        pb_utils.Tensor("orig_hw", sizes),
                    ]
                )
            )
        return responses
