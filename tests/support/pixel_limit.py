"""A model published as the worker publishes it, with the API's pixel limit, for the tests
of the preprocess model's own limit (a 64 x 64 Identity graph: nothing here runs it)."""

from __future__ import annotations

import io
from pathlib import Path

import onnx
from PIL import Image

from maskops.data.labels import LabelMap
from maskops.export.graph import GraphMetadata, set_metadata
from maskops.serving import publish
from maskops.spec.models import ExperimentSpec
from maskops_core.settings import Settings

LIMIT: int = Settings.model_fields["max_infer_image_pixels"].default
"""The API's default limit (MASKOPS_MAX_INFER_IMAGE_PIXELS)."""
NAME = "m"


def publish_limited(tmp_path: Path) -> Path:
    """A repository holding ``NAME`` version 1, published with ``LIMIT``."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["images"], ["boxes"])],
        "g",
        [onnx.helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT, [1, 3, 64, 64])],
        [onnx.helper.make_tensor_value_info("boxes", onnx.TensorProto.FLOAT, [1, 3, 64, 64])],
    )
    model = onnx.helper.make_model(graph)
    set_metadata(
        model,
        GraphMetadata(
            spec=ExperimentSpec(),
            label_map=LabelMap.from_coco_categories([{"id": 1, "name": "a"}]),
            data_type="fp32",
            image_size=(64, 64),
            max_detections=2,
            mask_resolution=4,
        ),
    )
    onnx.save(model, str(tmp_path / "m.onnx"))
    repository = tmp_path / "repository"
    publish(tmp_path / "m.onnx", repository, NAME, max_image_pixels=LIMIT)
    return repository


def png(width: int, height: int, mode: str = "RGB") -> bytes:
    """A PNG of one colour: 13000 x 13000 in mode "1" is 21 KB (169 MP to decode)."""
    buffer = io.BytesIO()
    Image.new(mode, (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()
