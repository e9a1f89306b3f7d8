"""The preprocess model in a real Triton refuses an image above the API's pixel limit from
its header (a client may skip the API): a 13000 x 13000 PNG gets a clean
per-request error in well under a second and the stub's memory does not grow. Only the
preprocess part of a published ensemble is loaded (a python-backend stub, seconds)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from maskops.serving import EnsembleNames
from maskops.serving.client import InvalidImage, _translate
from maskops.serving.launcher import TritonServer
from tests.conftest import PeakRss
from tests.support.pixel_limit import LIMIT, NAME, png, publish_limited

pytestmark = pytest.mark.integration
PREPROCESS = EnsembleNames(NAME).preprocess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = publish_limited(tmp_path_factory.mktemp("pixel_limit"))
    with TritonServer(repository, models=[PREPROCESS]) as running:
        yield running


def _preprocess(server: TritonServer, image: bytes) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        data = httpclient.InferInput("image_bytes", [1, len(image)], "UINT8")
        data.set_data_from_numpy(np.frombuffer(image, dtype=np.uint8)[None], binary_data=True)
        result = client.infer(PREPROCESS, [data])
        return {name: result.as_numpy(name) for name in ("scale", "orig_hw")}
    finally:
        client.close()


def _stub_pid(server: TritonServer) -> int:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes()
        except OSError:  # gone meanwhile
            continue
        if b"triton_python_backend_stub" in args and f"/{PREPROCESS}/".encode() in args:
            return int(cmdline.parent.name)
    raise LookupError(f"no python backend stub runs {PREPROCESS}")


def test_a_huge_png_gets_a_clean_error_without_being_decoded(server: TritonServer) -> None:
    assert _preprocess(server, png(40, 30))["orig_hw"].tolist() == [[30, 40]]  # warm
    huge = png(13000, 13000, mode="1")
    with PeakRss(_stub_pid(server)) as stub:
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as refused:
            _preprocess(server, huge)
        took = time.monotonic() - started
    message = refused.value.message()
    assert f"image 0: 13000 x 13000 pixels is above this model's limit of {LIMIT}" in message
    assert isinstance(_translate(refused.value, NAME, ""), InvalidImage)
    assert took < 1.0, took  # decoding it took 6.6 s
    assert stub.grew_mb < 30, stub.grew_mb  # and 2.2 GB
    # The stub still serves.
    assert _preprocess(server, png(64, 48))["orig_hw"].tolist() == [[48, 64]]
