"""The preprocess model's own image limits: publish writes the API's limits (pixels, side,
aspect) into its settings.json, and the model refuses a larger image from its header,
before any decoding, with a per-request error the client reads as an invalid image. The
model runs here under a stand-in for Triton's python stub module."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format, text_format
from PIL import Image
from tritonclient.grpc import model_config_pb2

from maskops.serving import EnsembleNames
from maskops.serving.client import InvalidImage, _translate
from maskops.serving.protocol import ImageLimits
from maskops.serving.triton_models import maskops_serving_ops as ops
from maskops.serving.triton_models.maskops_serving_ops import padded_rows
from tests.support.pixel_limit import LIMIT, LIMITS, NAME, png, publish_limited


class _Error(Exception):
    def message(self) -> str:
        return str(self)


class _Response:
    def __init__(self, output_tensors: list[Any] | None = None, error: Any = None) -> None:
        self.output_tensors, self.error = output_tensors, error


class _Input:
    """A stub input tensor: the models read it by DLPack, as they read Triton's."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.array.__dlpack_device__()


def _stub() -> types.ModuleType:
    """What the preprocess model uses of ``triton_python_backend_utils``."""
    module = types.ModuleType("triton_python_backend_utils")
    # Outputs leave by DLPack alone (maskops_serving_ops.output_tensor): Triton's
    # Tensor(name, array) misreads numpy 2 arrays, so the stub has none.
    module.Tensor = types.SimpleNamespace(from_dlpack=lambda name, array: (name, array))  # type: ignore[attr-defined]
    module.InferenceResponse = _Response  # type: ignore[attr-defined]
    module.TritonError = _Error  # type: ignore[attr-defined]
    module.get_input_tensor_by_name = lambda request, name: _Input(request[name])  # type: ignore[attr-defined]
    return module


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return publish_limited(tmp_path)


@pytest.fixture
def preprocess(repository: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The published preprocess model, initialized as Triton does."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _stub())
    folder = repository / EnsembleNames(NAME).preprocess
    path = folder / "1" / "model.py"
    spec = importlib.util.spec_from_file_location("preprocess_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # model.py imports maskops_serving_ops from its own folder: not left for other tests.
    monkeypatch.delitem(sys.modules, "maskops_serving_ops")
    model = module.TritonPythonModel()
    model.initialize({**config_argument(folder), "model_repository": str(folder)})
    return model


def config_argument(folder: Path) -> dict[str, str]:
    """What Triton hands ``initialize`` of a model's config: its JSON, field names as in
    the proto, and the version."""
    text = (folder / "config.pbtxt").read_text()
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    as_json = json_format.MessageToJson(config, preserving_proto_field_name=True)
    return {"model_config": as_json, "model_version": "1"}


def _request(*images: bytes) -> dict[str, np.ndarray]:
    return {"image_bytes": padded_rows(images, fill=b"\0")}


def test_publish_writes_the_limit_for_the_preprocess_model(repository: Path) -> None:
    names = EnsembleNames(NAME)
    written = json.loads((repository / names.preprocess / "1" / "settings.json").read_text())
    assert written["max_image_pixels"] == LIMIT
    assert {key: written[key] for key in LIMITS.as_settings()} == LIMITS.as_settings()
    assert "max_image_pixels" not in json.loads(
        (repository / names.net / "1" / "settings.json").read_text()
    )


def test_a_huge_png_is_refused_from_its_header(preprocess: Any) -> None:
    """13000 x 13000 (169 MP, under Pillow's own limit): 6.6 s and +2.2 GB to decode."""
    huge = png(13000, 13000, mode="1")  # 21 KB on the wire
    small = png(40, 30)
    started = time.monotonic()
    [response] = preprocess.execute([_request(small, huge)])
    took = time.monotonic() - started
    assert response.error is not None and response.output_tensors is None
    message = str(response.error)
    assert message == f"image 1: 13000 x 13000 pixels is above this model's limit of {LIMIT} pixels"
    assert took < 1.0, took  # decoded, it takes seconds
    # The client reads the answer as an invalid image (the API's 422), not a server error.
    assert isinstance(_translate(_Error(message), "m", ""), InvalidImage)


def test_images_within_the_limit_are_prepared(preprocess: Any) -> None:
    [response] = preprocess.execute([_request(png(40, 30), png(1000, 800, mode="1"))])
    assert response.error is None
    names = [name for name, _ in response.output_tensors]
    assert names == ["images", "scale", "orig_hw"]
    assert response.output_tensors[2][1].tolist() == [[30, 40], [800, 1000]]


def test_each_image_is_written_into_its_row_of_the_batch(preprocess: Any) -> None:
    """The model writes each network input straight into the batch it hands on (no stack
    and copy): the rows, padding included, are what ``preprocess`` gives each image."""
    rng = np.random.default_rng(0)
    images = [png(40, 30), _photo_png(rng, 75, 20), _photo_png(rng, 13, 90)]
    [response] = preprocess.execute([_request(*images)])
    assert response.error is None
    (_, batch), (_, scales), (_, sizes) = response.output_tensors
    assert batch.dtype == np.float32 and batch.shape == (3, 3, *preprocess.image_size)
    for i, data in enumerate(images):
        image, scale, hw = ops.preprocess(data, preprocess.image_size)
        np.testing.assert_array_equal(batch[i], image)
        assert scales[i].tolist() == [np.float32(scale)] and sizes[i].tolist() == list(hw)


def _photo_png(rng: np.random.Generator, width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
        buffer, format="PNG"
    )
    return buffer.getvalue()


def test_a_version_published_without_a_limit_decodes_as_before(preprocess: Any) -> None:
    preprocess.limits = type(preprocess.limits)()  # an older settings.json: no limits
    [response] = preprocess.execute([_request(b"not an image")])
    assert "unreadable image" in str(response.error)


def test_a_thin_png_is_refused_by_its_aspect_before_any_resize(preprocess: Any) -> None:
    """1 x 50,000,000 (69 bytes, within the pixel limit): its resize weights once took
    Triton 65 s and 1.8 GB."""
    thin = png(50_000_000, 1, mode="1")
    started = time.monotonic()
    [response] = preprocess.execute([_request(thin)])
    assert time.monotonic() - started < 1.0
    assert str(response.error) == (
        "image 0: 50000000 x 1 pixels: an aspect ratio above this model's limit of "
        f"{LIMITS.max_image_aspect:g}:1"
    )


def test_a_side_beyond_the_limit_is_refused(preprocess: Any) -> None:
    assert LIMITS.max_image_side is not None
    side = LIMITS.max_image_side + 1
    [response] = preprocess.execute([_request(png(side, side // 19, mode="1"))])
    assert f"a side above this model's limit of {LIMITS.max_image_side} pixels" in str(
        response.error
    )


@pytest.mark.parametrize(
    "limits",
    [ImageLimits(), ImageLimits(100, 50, 3.0), ImageLimits(max_image_aspect=1.5)],
    ids=["none", "all", "aspect"],
)
def test_the_model_judges_shapes_as_the_api_does(preprocess: Any, limits: ImageLimits) -> None:
    """The model's copy of ``protocol.ImageLimits`` (it cannot import maskops) reads the
    same settings keys and refuses the same shapes for the same reasons."""
    model_limits = type(preprocess.limits).from_settings(limits.as_settings())
    for width in (1, 2, 5, 9, 10, 11, 30, 49, 50, 51, 200):
        for height in (1, 3, 10, 40, 51):
            assert model_limits.refusal(width, height) == limits.refusal(width, height)
