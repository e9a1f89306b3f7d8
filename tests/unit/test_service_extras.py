"""Each service's extra installs: the Dockerfiles install exactly their extra through
services/install-extra, and the Triton image's Python gets wheels for the lock's pins."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "api": REPO / "services" / "api" / "Dockerfile",
    "worker": REPO / "services" / "worker" / "Dockerfile",
    "triton": REPO / "services" / "triton" / "Dockerfile",
}
TRITON_IMAGE_PYTHON = {"24.12": "3.12"}
"""The Python of the official Triton images we build on (their release notes)."""


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    return extras


@pytest.mark.parametrize("service", sorted(DOCKERFILES))
def test_each_image_installs_exactly_its_extra(service: str) -> None:
    dockerfile = DOCKERFILES[service].read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert not installs, f"{service}: install through services/install-extra only: {installs}"
    assert f"RUN services/install-extra {service}\n" in dockerfile
    assert service in _extras()


def test_api_extra_has_no_model_library() -> None:
    api = " ".join(_extras()["api"] + _extras()["core"])
    for heavy in ("torch", "onnx", "pillow", "pycocotools", "nvidia-pytriton"):
        assert not re.search(rf"(^|[\s\"']){re.escape(heavy)}([\[<>=\s\"']|$)", api), heavy


def test_the_triton_image_python_has_wheels_for_the_triton_extra(tmp_path: Path) -> None:
    tag = re.search(r"tritonserver:(\d+\.\d+)-py3", DOCKERFILES["triton"].read_text())
    assert tag and tag.group(1) in TRITON_IMAGE_PYTHON, "add the image's Python above"
    python = TRITON_IMAGE_PYTHON[tag.group(1)]
    platforms = [
        f"--platform={p}"
        for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux2014_x86_64")
    ]
    result = subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--only-binary=:all:", f"--python-version={python}", *platforms,
            "--constraint", str(REPO / "requirements.lock"), "--dest", str(tmp_path),
            *_extras()["triton"],
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert any(p.name.startswith("onnxruntime-") for p in tmp_path.iterdir())
