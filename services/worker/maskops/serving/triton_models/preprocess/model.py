"""``_<name>.preprocess``: encoded image bytes -> resized, padded float image + scale + size.

Inputs (per batch item): ``image_bytes`` BYTES ``[1]``. Outputs: ``images`` FP32
``[3, H, W]`` (RGB 0..1, the graph normalises), ``scale`` FP32 ``[1]``, ``orig_hw`` INT32
``[2]``. A request whose bytes do not decode, or whose image has more pixels than
``max_image_pixels`` (settings.json, written by publish from the API's own limit), gets an
error naming the problem (the client turns it into ``InvalidImage``). The API checks that
limit too, but a client may talk to Triton directly: a 13000 x 13000 PNG of 164 KB took
6.6 s and 2.2 GB to decode.
"""

from __future__ import annotations

import io
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image

# maskops_serving_ops.py is copied next to this file by publish (Triton runs each model in
# its own stub process, so the plain module name cannot collide).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import maskops_serving_ops as ops


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        settings = json.loads((version_dir / "settings.json").read_text())
        self.image_size = (int(settings["image_size"][0]), int(settings["image_size"][1]))
        # Versions published before the limit was written have none but Pillow's own.
        limit = settings.get(MAX_PIXELS_KEY)
        self.max_pixels = None if limit is None else int(limit)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]

    def _answer(self, request: Any) -> Any:
        encoded = pb_utils.get_input_tensor_by_name(request, ops.IMAGE_BYTES).as_numpy()
        try:
            prepared = [
                self._prepare(bytes(item.reshape(-1)[0]), f"image {i}")
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

    def _prepare(self, data: bytes, name: str) -> tuple[np.ndarray, float, tuple[int, int]]:
        if self.max_pixels is not None:
            check_pixels(data, self.max_pixels, name=name)
        prepared: tuple[np.ndarray, float, tuple[int, int]] = ops.preprocess(
            data, self.image_size, name=name
        )
        return prepared


MAX_PIXELS_KEY = "max_image_pixels"
"""In the version's settings.json (:func:`maskops.serving.repository.publish`)."""


def check_pixels(data: bytes, limit: int, *, name: str) -> None:
    """Refuse an image of more than ``limit`` pixels from its header alone (Pillow reads
    the size on open and decodes nothing until asked); bytes that are no image are left to
    the decoder, which names what is wrong."""
    refused = f"above this model's limit of {limit} pixels"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
    except Image.DecompressionBombError as exc:  # beyond twice Pillow's own limit
        raise ops.ImageDecodeError(f"{name}: {refused} ({exc})") from None
    except Exception:
        return
    if width * height > limit:
        raise ops.ImageDecodeError(f"{name}: {width} x {height} pixels is {refused}")
