"""``_<name>.preprocess``: encoded image bytes -> resized, padded image + scale + size.

Inputs (per batch item): ``image_bytes`` UINT8 ``[L]``, the encoded file (zero bytes may
follow it). Outputs: ``images`` ``[3, H, W]``, FP32 RGB 0..1 or UINT8 RGB 0..255, the type
this model's config gives it (UINT8 for the torch network, which divides on its device:
a quarter of the bytes to hand over and copy; the network normalises), ``scale`` FP32
``[1]``, ``orig_hw`` INT32 ``[2]``. A request whose bytes do not decode, or whose image
is beyond the limits in settings.json (written by publish from the API's own:
``max_image_pixels``, ``max_image_side``, ``max_image_aspect``), gets an error naming the
problem (the client turns it into ``InvalidImage``). The API checks those limits too, but
a client may talk to Triton directly: a 13000 x 13000 PNG of 164 KB took 6.6 s and 2.2 GB
to decode, and a 69-byte PNG of 1 x 50,000,000 pixels tied up the model for a minute.
"""

from __future__ import annotations

import io
import json
import sys
import warnings
from pathlib import Path
from typing import Any, NamedTuple

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
        # Versions published before a limit was written have none but Pillow's own.
        self.limits = ImageLimits.from_settings(settings)
        self.image_dtype = ops.output_dtype(json.loads(args["model_config"]), ops.NET_INPUT)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]

    def _answer(self, request: Any) -> Any:
        encoded = ops.input_array(pb_utils, request, ops.IMAGE_BYTES)
        # Each image is written straight into its row of the batch: stacking 13 MB network
        # inputs (832x1344) and converting the stack cost two more copies of each.
        images = np.empty((len(encoded), 3, *self.image_size), dtype=self.image_dtype)
        try:
            prepared = [
                self._prepare(item.tobytes(), f"image {i}", images[i])
                for i, item in enumerate(encoded)
            ]
        except ops.ImageDecodeError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        scales = np.array([[p[1]] for p in prepared], dtype=np.float32)
        sizes = np.array([p[2] for p in prepared], dtype=np.int32)
        return pb_utils.InferenceResponse(
            output_tensors=[
                ops.output_tensor(pb_utils, ops.NET_INPUT, images),
                ops.output_tensor(pb_utils, ops.SCALE, scales),
                ops.output_tensor(pb_utils, ops.ORIG_HW, sizes),
            ]
        )

    def _prepare(
        self, data: bytes, name: str, out: np.ndarray
    ) -> tuple[np.ndarray, float, tuple[int, int]]:
        """Decode and resize ``data`` into ``out`` (its network input); the scale and the
        original size come back."""
        if self.limits.any():
            check_shape(data, self.limits, name=name)
        prepared: tuple[np.ndarray, float, tuple[int, int]] = ops.preprocess(
            data, self.image_size, name=name, out=out
        )
        return prepared


class ImageLimits(NamedTuple):
    """``maskops.serving.protocol.ImageLimits`` (this model cannot import maskops; a unit
    test checks the two agree): the largest image the model decodes (None: no limit). A
    NamedTuple: dataclasses need the module registered, and Triton's loader may not."""

    max_image_pixels: int | None = None
    max_image_side: int | None = None
    max_image_aspect: float | None = None

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> ImageLimits:
        return cls(
            max_image_pixels=_optional(settings.get("max_image_pixels"), int),
            max_image_side=_optional(settings.get("max_image_side"), int),
            max_image_aspect=_optional(settings.get("max_image_aspect"), float),
        )

    def any(self) -> bool:
        return any(value is not None for value in self)

    def refusal(
        self, width: int, height: int, *, limit: str = "the limit"
    ) -> tuple[str, str] | None:
        """Which limit a ``width`` x ``height`` image breaks and why, or None."""
        size = f"{width} x {height} pixels"
        long_side, short_side = max(width, height), min(width, height)
        if self.max_image_pixels is not None and width * height > self.max_image_pixels:
            return "pixels", f"{size} is above {limit} of {self.max_image_pixels} pixels"
        if self.max_image_aspect is not None and long_side > self.max_image_aspect * short_side:
            why = f"{size}: an aspect ratio above {limit} of {self.max_image_aspect:g}:1"
            return "aspect", why
        if self.max_image_side is not None and long_side > self.max_image_side:
            return "side", f"{size}: a side above {limit} of {self.max_image_side} pixels"
        return None


def _optional(value: Any, kind: type[int] | type[float]) -> Any:
    return None if value is None else kind(value)


def check_shape(data: bytes, limits: ImageLimits, *, name: str) -> None:
    """Refuse an image beyond ``limits`` from its header alone (Pillow reads the size on
    open and decodes nothing until asked); bytes that are no image are left to the
    decoder, which names what is wrong."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
    except Image.DecompressionBombError as exc:  # beyond twice Pillow's own limit
        raise ops.ImageDecodeError(f"{name}: above this model's limits ({exc})") from None
    except Exception:
        return
    refusal = limits.refusal(width, height, limit="this model's limit")
    if refusal is not None:
        raise ops.ImageDecodeError(f"{name}: {refusal[1]}")
