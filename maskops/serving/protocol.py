"""What a client, the publisher and the served models agree on, with no engine import.

The API image installs only the ``api`` extra (no torch, no onnx): this module imports
the standard library alone (the control plane's core imports it for the model-name rule)
and :mod:`maskops.serving.client` nothing but it and numpy, so they hold the ensemble's
contract:

- the tensor names of the ensemble and of its parts;
- the Triton model names of a published model (:class:`EnsembleNames`) and the rule a
  user's model name follows (:func:`check_model_name`);
- the ``detections_json`` answer (:func:`encode_detections`, :func:`decode_detections`);
- the largest image a served model decodes (:class:`ImageLimits`), which ``/infer``
  checks and the preprocess model checks again for clients that call Triton directly.

The served python models cannot import maskops (the Triton image has only numpy, Pillow,
pycocotools and onnxruntime): their own copy of the tensor names lives in
``triton_models/maskops_serving_ops.py``, that of :class:`ImageLimits` in
``triton_models/preprocess/model.py``, and unit tests check the copies agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

# The ensemble's interface (what clients send and receive).
IMAGE_BYTES = "image_bytes"
"""Input: UINT8 ``[L]`` per request item, one encoded JPEG/PNG (items of one request are
padded with zero bytes to the longest). Versions published before were BYTES ``[1]``
(:data:`ENCODED_DATATYPES`)."""
SCORE_THRESHOLD = "score_threshold"
"""Input: FP32 ``[1]`` per request item; detections scoring below are dropped."""
DETECTIONS_JSON = "detections_json"
"""Output: UINT8 ``[L]`` per request item, the UTF-8 text of a JSON list of COCO results
(padded with spaces to the longest item of the request); BYTES ``[1]`` before."""
ENCODED_DATATYPES: tuple[str, ...] = ("UINT8", "BYTES")
"""How the ensemble carries ``image_bytes`` and ``detections_json``: UINT8 since the python
backend's stub loses BYTES tensors under numpy 2 (docs/architecture.md); BYTES in versions
published before, which clients still serve."""

# Between the parts (not visible to clients). The network's names are the exported
# graph's (maskops.export.graph.INPUT_NAME / OUTPUT_NAMES, checked equal by a unit test:
# that module imports torch and onnx, this one cannot).
NET_INPUT = "images"
"""The network's input: ``[3, H, W]`` per item, resized and padded; FP32 RGB 0..1, or UINT8
RGB 0..255 on the torch network, which divides by 255 itself (versions published before
took FP32 there too)."""
NET_OUTPUTS: tuple[str, ...] = ("boxes", "scores", "labels", "masks", "num_detections")
"""The network's outputs per item, padded to D rows: FP32 ``[D, 4]`` xyxy, FP32 ``[D]``,
INT64 ``[D]`` (labels 1..K), FP32 ``[D, M, M]`` mask probabilities, INT32 ``[1]``."""
SCALE = "scale"
"""Preprocess output: FP32 ``[1]``, the resize factor original -> network frame."""
ORIG_HW = "orig_hw"
"""Preprocess output: INT32 ``[2]``, the original image's (height, width)."""

NET_PARAMETERS = {
    "maskops_net_backend": "net_backend",
    "maskops_device": "device",
    "maskops_precision": "precision",
}
"""The network config's ``parameters`` that record where and how it runs (publish writes
them; ``GET /models/{name}`` reads them back from Triton), and the names they are
reported under: net backend (python, onnxruntime, tensorrt, torch), device (cpu, gpu),
precision (the export's data type; the torch backend's fp32, bf16, fp16 or auto)."""

MODEL_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A user's model name (the ensemble clients call), whole: the one rule, which the publish
job's options and the REST paths naming a model take too (``maskops_core.options``)."""

INTERNAL_PREFIX = "_"
"""First character of the ensemble's internal parts: no user name can start with it."""


class InvalidModelName(ValueError):
    """A model name that does not follow :data:`MODEL_NAME_PATTERN`."""


def check_model_name(name: str) -> str:
    """Return ``name`` if it is a valid user model name, else raise :class:`InvalidModelName`."""
    if not isinstance(name, str) or MODEL_NAME_PATTERN.fullmatch(name) is None:
        raise InvalidModelName(
            f"model name {name!r}: use 1 to 64 letters, digits, '-', '_' and '.', starting "
            "with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class EnsembleNames:
    """The four Triton model names of a published model ``name``.

    The parts are ``_<name>.preprocess``, ``_<name>.net`` and ``_<name>.postprocess``.
    No user model can have one of these names: user names never start with ``_``. Nor can
    two parts share one: a part name decodes uniquely, the part being the text after the
    last ``.`` (part names have no ``.``) and the model name what lies between the ``_``
    and that ``.`` (so ``_a.net.net`` can only be ``a.net``'s network). Triton accepts
    such names (tests/integration/triton serves them).
    """

    name: str

    def _part(self, part: str) -> str:
        return f"{INTERNAL_PREFIX}{self.name}.{part}"

    @property
    def preprocess(self) -> str:
        return self._part("preprocess")

    @property
    def net(self) -> str:
        return self._part("net")

    @property
    def postprocess(self) -> str:
        return self._part("postprocess")

    @property
    def parts(self) -> tuple[str, str, str]:
        """The composing models, in the order the ensemble runs them."""
        return (self.preprocess, self.net, self.postprocess)

    @property
    def load_order(self) -> tuple[str, str, str, str]:
        """Composing models first, the ensemble last."""
        return (*self.parts, self.name)


def encode_detections(results: Sequence[dict[str, Any]]) -> bytes:
    """One image's COCO results as the ``detections_json`` bytes (compact JSON list)."""
    return json.dumps(list(results), separators=(",", ":")).encode()


def decode_detections(data: bytes | str) -> list[dict[str, Any]]:
    """The COCO results of a ``detections_json`` answer.

    Each result: ``image_id`` (0; the client sets the image's position), ``category_id``,
    ``category_name``, ``bbox`` ``[x, y, w, h]`` original pixels, ``score``,
    ``segmentation`` (compressed RLE ``{"size": [h, w], "counts": str}``).

    Raises:
        ValueError: not a JSON list.
    """
    value = json.loads(data)
    if not isinstance(value, list):
        raise ValueError("expected a JSON list of COCO results")
    return value


ImageLimit = Literal["pixels", "aspect", "side"]


@dataclass(frozen=True)
class ImageLimits:
    """The largest image a served model decodes, judged from its header: pixels, ratio of
    the long side to the short one, longest side (None: no limit). The field names are
    the keys of the preprocess model's settings.json."""

    max_image_pixels: int | None = None
    max_image_side: int | None = None
    max_image_aspect: float | None = None

    def as_settings(self) -> dict[str, int | float]:
        """The limits set, as the preprocess model's settings.json holds them."""
        return {key: value for key, value in vars(self).items() if value is not None}

    def refusal(
        self, width: int, height: int, *, limit: str = "the limit"
    ) -> tuple[ImageLimit, str] | None:
        """Which limit a ``width`` x ``height`` image breaks and why, or None (pixels
        first, then aspect, then side)."""
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
