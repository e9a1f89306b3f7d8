"""Each service's extra installs: the Dockerfiles install exactly their extra through
services/install-extra, and the Triton image's Python gets wheels for the lock's pins.
The GPU images (the triton image, GPU workers) take the -gpu extras: onnxruntime-gpu in
place of onnxruntime."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "api": REPO / "services" / "api" / "Dockerfile",
    "worker": REPO / "services" / "worker" / "Dockerfile",
    "triton": REPO / "services" / "triton" / "Dockerfile",
}
TRITON_IMAGE_PYTHON = {"24.12": "3.12"}
"""The Python of the official Triton images we build on (their release notes)."""
IMAGE_EXTRA = {"api": "api", "worker": "worker", "triton": "triton-gpu"}
"""The extra each image installs unless built with another MASKOPS_EXTRA."""
PLATFORMS = [
    f"--platform={p}"
    for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux2014_x86_64")
]


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    return extras


def _requirements(extra: str) -> list[str]:
    """What ``maskops[extra]`` requires, the project's own extras expanded."""
    found: list[str] = []
    for requirement in _extras()[extra]:
        own = re.fullmatch(r"maskops\[([\w,-]+)\]", requirement)
        if own:
            found += [r for name in own.group(1).split(",") for r in _requirements(name)]
        else:
            found.append(requirement)
    return found


def _names(extra: str) -> set[str]:
    return {re.split(r"[\[<>=;\s]", r, maxsplit=1)[0].lower() for r in _requirements(extra)}


@pytest.mark.parametrize("service", sorted(DOCKERFILES))
def test_each_image_installs_exactly_its_extra(service: str) -> None:
    dockerfile = DOCKERFILES[service].read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert not installs, f"{service}: install through services/install-extra only: {installs}"
    extra = IMAGE_EXTRA[service]
    arg = f"ARG MASKOPS_EXTRA={extra}\n"
    if arg in dockerfile:
        assert 'RUN services/install-extra "$MASKOPS_EXTRA"\n' in dockerfile
    else:
        assert f"RUN services/install-extra {extra}\n" in dockerfile
    assert extra in _extras()


@pytest.mark.parametrize(
    ("cpu", "gpu"), [("engine", "engine-gpu"), ("worker", "worker-gpu"), ("triton", "triton-gpu")]
)
def test_gpu_extras_swap_onnxruntime_for_its_gpu_build(cpu: str, gpu: str) -> None:
    """Both builds install the module onnxruntime: an environment holds exactly one."""
    assert "onnxruntime" in _names(cpu) and "onnxruntime-gpu" not in _names(cpu)
    assert "onnxruntime-gpu" in _names(gpu) and "onnxruntime" not in _names(gpu)
    assert _names(cpu) - {"onnxruntime"} == _names(gpu) - {"onnxruntime-gpu"}


def test_gpu_workers_build_the_gpu_extra() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    builds = {name: s["build"] for name, s in services.items() if "worker" in name}
    assert builds["worker-gpu0"]["args"]["MASKOPS_EXTRA"] == "worker-gpu"
    assert "args" not in builds["worker-cpu"]
    assert services["worker-gpu0"]["image"] != services["worker-cpu"]["image"]


def test_the_lock_pins_the_gpu_build_apart() -> None:
    """./dev installs the lock but the lines marked for the GPU images."""
    lock = (REPO / "requirements.lock").read_text().splitlines()
    (gpu_line,) = [line for line in lock if line.startswith("onnxruntime-gpu==")]
    assert (
        '-r <(grep -v -e "# gpu images only" -e "# no-deps" "$LOCK")' in (REPO / "dev").read_text()
    )
    marked = [line for line in lock if "# gpu images only" in line]
    assert marked == [gpu_line]


NO_DEPS = {"nvidia-pytriton": {"serve", "dev"}}
"""The wheels the lock marks "# no-deps for EXTRA,...", and those extras."""


@pytest.mark.parametrize("extra", ["serve", "dev", "api", "triton", "worker"])
def test_install_extra_adds_the_no_deps_wheels_its_extra_needs(extra: str) -> None:
    """services/install-extra, run with a pip that echoes: the extra at the lock's
    versions, then the wheels marked for it, without their dependencies."""
    lock = (REPO / "requirements.lock").read_text().splitlines()
    pins = {line.split("==")[0]: line.split()[0] for line in lock if "==" in line}
    result = subprocess.run(
        [str(REPO / "services" / "install-extra"), extra, "echo"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    calls = result.stdout.splitlines()
    assert calls[0] == f"install --constraint {REPO}/requirements.lock {REPO}[{extra}]"
    wanted = sorted(pins[name] for name, extras in NO_DEPS.items() if extra in extras)
    assert calls[1:] == ([f"install --no-deps {' '.join(wanted)}"] if wanted else [])
    for name in NO_DEPS:
        assert name not in _names(extra)


def test_only_the_no_deps_wheels_declare_what_the_lock_refuses() -> None:
    """This environment is the lock installed (./dev): every requirement its packages
    declare holds, but those of the wheels installed without their dependencies."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "check", "--disable-pip-version-check"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    broken = {line.split()[0].lower() for line in result.stdout.splitlines() if line.strip()}
    assert broken <= set(NO_DEPS), result.stdout


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_the_gpu_extras_resolve_to_wheels(tmp_path: Path, python: str) -> None:
    """The GPU images' Pythons (3.11: the worker, 3.12: Triton 24.12) get wheels for every
    pin the -gpu extra pulls in (resolved from the index's metadata, nothing downloaded)."""
    extra = {"3.11": "worker-gpu", "3.12": "triton-gpu"}[python]
    wanted = [r for r in _requirements(extra) if not r.startswith(("torch", "tritonclient"))]
    result = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
            "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
            f"--python-version={python}", *PLATFORMS, "--target", str(tmp_path / "t"),
            "--report", str(tmp_path / "report.json"),
            "--constraint", str(REPO / "requirements.lock"), *wanted,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    installed = {i["metadata"]["name"].lower(): i for i in report["install"]}
    wheel = installed["onnxruntime-gpu"]["download_info"]["url"].rsplit("/", 1)[-1]
    assert f"-cp{python.replace('.', '')}-" in wheel and "manylinux" in wheel, wheel
    assert "onnxruntime" not in installed


def test_api_extra_has_no_model_library() -> None:
    api = " ".join(_extras()["api"] + _extras()["core"])
    for heavy in ("torch", "onnx", "scipy", "pillow", "pycocotools", "nvidia-pytriton"):
        assert not re.search(rf"(^|[\s\"']){re.escape(heavy)}([\[<>=\s\"']|$)", api), heavy


def test_the_triton_image_python_has_wheels_for_the_triton_extra(tmp_path: Path) -> None:
    tag = re.search(r"tritonserver:(\d+\.\d+)-py3", DOCKERFILES["triton"].read_text())
    assert tag and tag.group(1) in TRITON_IMAGE_PYTHON, "add the image's Python above"
    python = TRITON_IMAGE_PYTHON[tag.group(1)]
    platforms = PLATFORMS
    result = subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--only-binary=:all:", f"--python-version={python}", *platforms,
            "--constraint", str(REPO / "requirements.lock"), "--dest", str(tmp_path),
            *_requirements("triton"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert any(p.name.startswith("onnxruntime-") for p in tmp_path.iterdir())
