"""``maskops publish`` into two real Tritons (the PyPI binary): all replicas or none.

The same sequence the publish job runs (``maskops.serving.rollout``): the version is
loaded on every ``--triton_url`` inside the publish, so a replica that cannot load it
undoes the publish; ``--max_image_pixels`` reaches the preprocess model, and
``--processing_instances`` the instance counts Triton loads.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from PIL import Image

from maskops.cli.main import main
from maskops.serving import client as triton
from maskops.serving import existing_versions
from maskops.serving.launcher import TritonServer, free_port
from maskops.serving.protocol import EnsembleNames

pytestmark = pytest.mark.integration

NAME = "cli_shapes"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    """Two Tritons on one empty repository (explicit model control: nothing loaded)."""
    repository = tmp_path_factory.mktemp("cli_repository")
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(TritonServer(repository, models=())) for _ in range(2)]
        yield repository, [server.http_url for server in servers]


def png(side: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (90, 120, 150)).save(buffer, format="PNG")
    return buffer.getvalue()


def publish(exported: Path, repository: Path, *urls: str) -> int:
    flags = [arg for url in urls for arg in ("--triton_url", url)]
    return main(
        ["publish", "-m", str(exported), "-n", NAME, "--repository", str(repository),
         "--max_image_pixels", "10000", "--processing_instances", "2", *flags]
    )  # fmt: skip


def test_publish_serves_on_every_replica_or_on_none(
    exported: Path, replicas: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    repository, urls = replicas
    dead = f"127.0.0.1:{free_port()}"
    assert publish(exported, repository, *urls, dead) != 0
    assert "did not load" in capsys.readouterr().err
    assert existing_versions(repository, NAME) == []  # undone: nothing was listed

    assert publish(exported, repository, *urls) == 0
    assert f"{urls[0]}: serves version 1" in capsys.readouterr().out
    for url in urls:
        assert triton.model_states(url, NAME) == {"1": "READY"}
        assert _instance_counts(url) == {"preprocess": 2, "net": 1, "postprocess": 2}
        assert triton.infer_images(url, NAME, [png(96)])[0] is not None  # 9,216 pixels
        with pytest.raises(triton.InvalidImage, match="pixels"):
            triton.infer_images(url, NAME, [png(101)])  # 10,201 pixels: over the limit


def _instance_counts(url: str) -> dict[str, int]:
    """``{part: instances}`` of the configs Triton loaded for NAME's composing models."""
    names = EnsembleNames(NAME)
    with httpclient.InferenceServerClient(url.removeprefix("http://")) as client:
        configs = {part: client.get_model_config(part) for part in names.parts}
    return {
        part.rsplit(".", 1)[1]: sum(group["count"] for group in config["instance_group"])
        for part, config in configs.items()
    }
