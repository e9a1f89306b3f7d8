"""``_<name>.postprocess``: padded detections -> COCO results JSON in original pixels.

Inputs per batch item: ``boxes``, ``scores``, ``labels``, ``masks``, ``num_detections``
(the network's outputs), ``scale`` and ``orig_hw`` (the preprocessing's) and
``score_threshold`` FP32 ``[1]`` (the client's). Output: ``detections_json`` UINT8 ``[L]``,
the UTF-8 text of a JSON list of COCO results (category id and name from the label map,
bbox xywh in original pixels, score, segmentation as compressed RLE pasted into the
original size); the rows of one request are padded with spaces to the longest.
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
        entries = json.loads((version_dir / "label_map.json").read_text())
        self.categories = ops.categories_from_label_map(entries)
        self.inputs = (*ops.NET_OUTPUTS, ops.SCALE, ops.ORIG_HW, ops.SCORE_THRESHOLD)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            t = {name: ops.input_array(pb_utils, request, name) for name in self.inputs}
            encoded = [self._image(t, i) for i in range(t["scores"].shape[0])]
            rows = ops.padded_rows(encoded, fill=b" ")
            out = ops.output_tensor(pb_utils, ops.DETECTIONS_JSON, rows)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def _image(self, t: dict[str, np.ndarray], i: int) -> bytes:
        """The ``detections_json`` of batch item ``i``."""
        boxes, scores, labels, masks = ops.unpad(
            t["boxes"][i], t["scores"][i], t["labels"][i], t["masks"][i], t["num_detections"][i]
        )
        results = ops.detections_to_coco(
            boxes,
            scores,
            labels,
            masks,
            scale=float(t[ops.SCALE][i][0]),
            orig_hw=(int(t[ops.ORIG_HW][i][0]), int(t[ops.ORIG_HW][i][1])),
            categories=self.categories,
            score_threshold=float(t[ops.SCORE_THRESHOLD][i][0]),
        )
        encoded: bytes = ops.encode_detections(results)
        return encoded
