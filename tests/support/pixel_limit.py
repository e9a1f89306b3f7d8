"""A model published as the worker publishes it, with the API's pixel limit, for the tests
of the preprocess model's own limit (an Identity graph: nothing here runs it)."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from maskops.serving import publish
from maskops.serving.protocol import ImageLimits
from maskops_core.settings import Settings
from tests.support.fake_export import fake_onnx_export

LIMIT: int = Settings.model_fields["max_infer_image_pixels"].default
"""The API's default limit (MASKOPS_MAX_INFER_IMAGE_PIXELS)."""
LIMITS = ImageLimits(**Settings().infer_image_limits)
"""The API's default limits (MASKOPS_MAX_INFER_IMAGE_*), as the worker publishes them."""
NAME = "m"


def publish_limited(tmp_path: Path) -> Path:
    """A repository holding ``NAME`` version 1, published with ``LIMITS``."""
    export = fake_onnx_export(tmp_path / "m.onnx", 1, data_type="fp32", max_batch_size=1)
    repository = tmp_path / "repository"
    publish(export, repository, NAME, image_limits=LIMITS)
    return repository


def png(width: int, height: int, mode: str = "RGB") -> bytes:
    """A PNG of one colour: 13000 x 13000 in mode "1" is 21 KB (169 MP to decode)."""
    buffer = io.BytesIO()
    Image.new(mode, (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()
