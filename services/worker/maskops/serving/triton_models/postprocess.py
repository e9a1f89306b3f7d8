"""``<name>_postprocess``: padded detections -> COCO results JSON in original pixels.

Inputs per batch item: ``boxes``, ``scores``, ``labels``, ``masks``, ``num_detections``
(the network's outputs), ``scale`` and ``orig_hw`` (the preprocessing's) and
``score_threshold`` FP32 ``[1]`` (the client's). Output: ``detections_json`` BYTES ``[1]``,
a JSON list of COCO results (category id and name from the label map, bbox xywh in
original pixels, score, segmentation as compressed RLE pasted into the original size).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from maskops.data.labels import LabelMap
from maskops.serving.processing import coco_results, encode_results, unpad_detections

INPUTS = (
    "boxes",
    "scores",
    "labels",
    "masks",
    "num_detections",
    "scale",
    "orig_hw",
    "score_threshold",
)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.label_map = LabelMap.from_json(
            json.loads((version_dir / "label_map.json").read_text())
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            t = {
                name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in INPUTS
            }
            encoded = []
            for i in range(t["scores"].shape[0]):
                output = unpad_detections(
                    t["boxes"][i],
                    t["scores"][i],
                    t["labels"][i],
                    t["masks"][i],
                    t["num_detections"][i],
                )
                results = coco_results(
                    output,
                    scale=float(t["scale"][i][0]),
                    orig_hw=(int(t["orig_hw"][i][0]), int(t["orig_hw"][i][1])),
                    label_map=self.label_map,
                    score_threshold=float(t["score_threshold"][i][0]),
                )
                encoded.append([encode_results(results)])
            out = pb_utils.Tensor("detections_json", np.array(encoded, dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
