"""Triton as maskops starts it is closed to the network, and its model control, which runs
a loaded model's code, answers the control plane's key alone (``maskops.serving.control``).

A load request may carry a model's files, a python backend's ``model.py`` included: an
open model control lets anyone who reaches the server run code as its user."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from maskops.serving import client as triton
from maskops.serving.control import (
    CONTROL_HEADER,
    CONTROL_KEY_ENV,
    new_control_key,
    restricted_api_argument,
)
from maskops.serving.launcher import TritonServer
from tests.support.triton_toy import toy_model

pytestmark = pytest.mark.integration
pytest.importorskip("pytriton")

EVIL_MODEL = """import pathlib


class TritonPythonModel:
    def initialize(self, args):
        pathlib.Path({marker!r}).write_text("ran")

    def execute(self, requests):
        return []
"""


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of each TCP socket process ``pid`` listens on (/proc, IPv4 and 6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                found.append((_address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw))
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    return ":".join(b"".join(words)[i : i + 2].hex() for i in range(0, 16, 2))


def _post(url: str, path: str, body: Mapping[str, object], headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        f"http://{url}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
def key() -> str:
    return new_control_key()


@pytest.fixture
def server(tmp_path: Path, key: str):
    repository = tmp_path / "repository"
    toy_model(repository, "toy")
    with TritonServer(
        repository,
        models=[],
        restricted_api=restricted_api_argument(key),
        log_file=tmp_path / "triton.log",
    ) as running:
        yield running


def test_it_listens_on_loopback_alone_and_serves_no_grpc(server: TritonServer) -> None:
    assert server.pid is not None
    sockets = listening(server.pid)
    # HTTP and metrics, both on loopback; no gRPC port at all.
    assert sorted(sockets) == sorted(
        [("127.0.0.1", server.http_port), ("127.0.0.1", server.metrics_port)]
    )


def test_a_load_that_carries_code_is_refused_without_the_key(
    server: TritonServer, tmp_path: Path, key: str
) -> None:
    marker = tmp_path / "code-ran"
    evil = EVIL_MODEL.format(marker=str(marker))
    body = {
        "parameters": {
            "config": json.dumps({"backend": "python", "max_batch_size": 0}),
            "file:1/model.py": base64.b64encode(evil.encode()).decode(),
        }
    }
    path = "/v2/repository/models/evil/load"
    for headers in ({}, {CONTROL_HEADER: "not-the-key-not-the-key"}):
        assert _post(server.http_url, path, body, headers) == 403
        assert _post(server.http_url, "/v2/repository/index", {}, headers) == 403
    assert not marker.exists()
    assert not triton.is_ready(server.http_url, "evil")
    # What the key opens, it opens: the same request with it runs the code.
    assert _post(server.http_url, path, body, {CONTROL_HEADER: key}) == 200
    assert marker.read_text() == "ran"


def test_the_control_plane_loads_with_the_key_and_anyone_infers(
    server: TritonServer, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONTROL_KEY_ENV, raising=False)
    with pytest.raises(triton.ControlRefused, match=CONTROL_KEY_ENV):
        triton.load_model(server.http_url, "toy")
    monkeypatch.setenv(CONTROL_KEY_ENV, key)
    triton.load_model(server.http_url, "toy")
    assert triton.served_version(server.http_url, "toy") == "1"
    # Nobody else unloads what is published ...
    assert _post(server.http_url, "/v2/repository/models/toy/unload", {}, {}) == 403
    assert triton.is_ready(server.http_url, "toy")
    # ... while inference stays open to whoever reaches the server (the API's /infer).
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        data = httpclient.InferInput("IN", [1], "FP32")
        data.set_data_from_numpy(np.array([2.5], dtype=np.float32))
        answer = client.infer("toy", [data])
        assert answer.as_numpy("OUTPUT").tolist() == [2.5]
    finally:
        client.close()
