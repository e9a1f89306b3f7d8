"""services/triton/entrypoint.sh builds each TensorRT network with the batch profile that
publish recorded (trtexec and tritonserver replaced by scripts that print their
arguments: neither exists here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from maskops.serving import publish
from tests.support.fake_export import fake_onnx_export

ENTRYPOINT = Path(__file__).resolve().parents[3] / "services" / "triton" / "entrypoint.sh"
ECHO = """#!/bin/sh
echo "$(basename "$0") $*"
for a; do case "$a" in --saveEngine=*) touch "${a#*=}";; esac; done
"""


@pytest.fixture
def fake_tools(tmp_path: Path) -> dict[str, str]:
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("trtexec", "tritonserver"):
        (tools / name).write_text(ECHO)
        (tools / name).chmod(0o755)
    # python3 must be the one that has the standard library (any will do).
    (tools / "python3").symlink_to(sys.executable)
    return {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}


def _start(repo: Path, env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        ["bash", str(ENTRYPOINT), f"--model-repository={repo}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if line.startswith("trtexec")]


def test_dynamic_batch_gets_a_profile_up_to_max_batch_size(tmp_path, fake_tools):
    repo = tmp_path / "repo"
    publish(fake_onnx_export(tmp_path / "d.onnx", "batch"), repo, "dyn", net_backend="tensorrt")
    publish(fake_onnx_export(tmp_path / "s.onnx", 1), repo, "old", net_backend="tensorrt")
    (line_dyn, line_old) = _start(repo, fake_tools)
    assert "--minShapes=images:1x3x64x96" in line_dyn
    assert "--optShapes=images:3x3x64x96 --maxShapes=images:3x3x64x96" in line_dyn
    assert "--fp16" in line_dyn
    assert "Shapes" not in line_old  # a batch-1 graph has one shape
    assert (repo / "_dyn.net" / "1" / "model.plan").is_file()
    settings = json.loads((repo / "_dyn.net" / "1" / "settings.json").read_text())
    assert settings["max_batch_size"] == 3
    assert _start(repo, fake_tools) == []  # built once
