"""services/triton/entrypoint.sh makes the replica's engine cache, removes the cache of
versions the repository no longer has, builds only the TensorRT engines that repositories
of an older maskops lack, with the batch profile recorded then, and never keeps
tritonserver from starting (trtexec and tritonserver replaced by scripts that print their
arguments: neither exists here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from maskops.serving import publish
from maskops.serving.control import CONTROL_KEY_ENV, restricted_api_argument
from maskops.serving.placement import ENGINE_CACHE_ROOT, Placement
from maskops.serving.protocol import EnsembleNames
from tests.support.fake_export import fake_engine, fake_onnx_export

ENTRYPOINT = Path(__file__).resolve().parents[3] / "services" / "triton" / "entrypoint.sh"
CACHE_VARIABLE = "MASKOPS_TRITON_ENGINE_CACHE"
KEY = "k" * 16 + "-0123456789_abcdef"
ECHO = """#!/bin/sh
echo "$(basename "$0") $*"
case "$*" in *broken*) echo "trtexec: parse error" >&2; exit 1;; esac
for a; do case "$a" in --saveEngine=*) touch "${a#*=}";; esac; done
"""


@pytest.fixture
def fake_tools(tmp_path: Path) -> dict[str, str]:
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("trtexec", "tritonserver"):
        (tools / name).write_text(ECHO)
        (tools / name).chmod(0o755)
    # python3 must be one with maskops installed, as the Triton image's is (a link would
    # lose the virtualenv: Python finds it next to the path it was started by).
    (tools / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (tools / "python3").chmod(0o755)
    cache = str(tmp_path / "engine-cache" / "root")
    path = f"{tools}:{os.environ['PATH']}"
    return {**os.environ, "PATH": path, CACHE_VARIABLE: cache, CONTROL_KEY_ENV: KEY}


def _old_publish(repo: Path, name: str, onnx: Path, *, static: int | None) -> Path:
    """What an older maskops wrote for --net_backend tensorrt: the ONNX and a plan config."""
    version = repo / f"_{name}.net" / "1"
    version.mkdir(parents=True)
    (version.parent / "config.pbtxt").write_text(
        f'name: "_{name}.net"\nplatform: "tensorrt_plan"\n'
    )
    (version / "model.onnx").write_bytes(onnx.read_bytes())
    settings = {"image_size": [64, 96], "data_type": "fp16", "max_batch_size": 3}
    (version / "settings.json").write_text(json.dumps(settings | {"static_batch_size": static}))
    return version


def _entrypoint(
    repo: Path, env: dict[str, str], *, check: bool
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ENTRYPOINT), f"--model-repository={repo}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def _run(repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = _entrypoint(repo, env, check=True)
    started = f"tritonserver --model-repository={repo} --allow-grpc=false"
    assert done.stdout.splitlines()[-1] == f"{started} {restricted_api_argument(KEY)}"
    return done


def _start(repo: Path, env: dict[str, str]) -> tuple[list[str], str]:
    """The trtexec command lines the entrypoint ran, and what it said on stderr."""
    done = _run(repo, env)
    return [line for line in done.stdout.splitlines() if line.startswith("trtexec")], done.stderr


def test_old_plans_get_a_profile_up_to_max_batch_size(tmp_path, fake_tools):
    repo = tmp_path / "repo"
    onnx = fake_onnx_export(tmp_path / "d.onnx", "batch")
    dyn = _old_publish(repo, "dyn", onnx, static=None)
    _old_publish(repo, "old", onnx, static=1)
    (line_dyn, line_old), _ = _start(repo, fake_tools)
    assert "--minShapes=images:1x3x64x96" in line_dyn
    assert "--optShapes=images:3x3x64x96 --maxShapes=images:3x3x64x96" in line_dyn
    assert "--fp16" in line_dyn
    assert "Shapes" not in line_old  # a batch-1 graph has one shape
    assert (dyn / "model.plan").is_file()
    assert _start(repo, fake_tools)[0] == []  # built once


def test_a_failed_build_is_logged_and_the_server_starts(tmp_path, fake_tools):
    repo = tmp_path / "repo"
    onnx = fake_onnx_export(tmp_path / "d.onnx", "batch")
    broken = _old_publish(repo, "broken", onnx, static=None)
    good = _old_publish(repo, "good", onnx, static=None)
    built, errors = _start(repo, fake_tools)
    assert len(built) == 2
    assert f"no TensorRT engine for {broken} (build failed" in errors
    assert not [p.name for p in broken.iterdir() if p.name.startswith("model.plan")]
    assert (good / "model.plan").is_file()


def test_each_process_builds_into_a_temporary_of_its_own(tmp_path, fake_tools):
    """Replicas sharing the repository may build one plan at once."""
    repo = tmp_path / "repo"
    version = _old_publish(repo, "dyn", fake_onnx_export(tmp_path / "d.onnx", "batch"), static=1)
    (line,), _ = _start(repo, fake_tools)
    (target,) = [a.split("=", 1)[1] for a in line.split() if a.startswith("--saveEngine=")]
    assert target.startswith(f"{version}/model.plan.tmp.") and target != f"{version}/model.plan.tmp"
    assert [p.name for p in version.iterdir() if p.name.startswith("model.plan")] == ["model.plan"]


def test_trtexec_off_path_is_found_where_the_image_keeps_it(tmp_path, fake_tools):
    """NVIDIA's images keep trtexec in TensorRT's folder; TRTEXEC names another."""
    repo = tmp_path / "repo"
    _old_publish(repo, "dyn", fake_onnx_export(tmp_path / "d.onnx", "batch"), static=1)
    elsewhere = tmp_path / "tensorrt" / "bin"
    elsewhere.mkdir(parents=True)
    (Path(fake_tools["PATH"].split(":")[0]) / "trtexec").rename(elsewhere / "trtexec")
    built, errors = _start(repo, fake_tools)
    assert built == [] and "/usr/src/tensorrt/bin/trtexec" in errors  # tried there
    (line,), _ = _start(repo, {**fake_tools, "TRTEXEC": str(elsewhere / "trtexec")})
    assert line.startswith("trtexec --onnx=")


def test_the_engine_cache_is_made_and_keeps_only_versions_the_repository_has(tmp_path, fake_tools):
    repo = tmp_path / "repo"
    onnx = fake_onnx_export(tmp_path / "d.onnx", "batch")
    for _ in range(2):
        publish(onnx, repo, "m", placement=Placement("gpu"))
    cache = Path(fake_tools[CACHE_VARIABLE])
    _start(repo, fake_tools)
    assert cache.is_dir()
    names = EnsembleNames("m")
    for folder in (f"{names.net}.1", f"{names.net}.2", f"{names.net}.9", "unrelated"):
        (cache / folder).mkdir()
        (cache / folder / "engine").write_bytes(b"x")
    said = _run(repo, fake_tools).stdout
    assert sorted(p.name for p in cache.iterdir()) == [
        f"{names.net}.1",
        f"{names.net}.2",
        "unrelated",
    ]
    assert f"removing the engine cache of {names.net}.9" in said


def test_the_default_cache_is_the_one_publish_writes_into_configs():
    text = ENTRYPOINT.read_text()
    assert f'ENGINE_CACHE="${{{CACHE_VARIABLE}:-{ENGINE_CACHE_ROOT}}}"' in text


def test_what_publish_writes_now_needs_no_build(tmp_path, fake_tools):
    repo = tmp_path / "repo"
    onnx = fake_onnx_export(tmp_path / "d.onnx", "batch")
    publish(onnx, repo, "ort", placement=Placement("gpu"))
    fake_engine(onnx)
    publish(onnx, repo, "plan", net_backend="tensorrt", placement=Placement("gpu"))
    assert _start(repo, fake_tools)[0] == []


@pytest.mark.parametrize("key", [None, "", "change-me", "a" * 20 + ",model-repository"])
def test_no_server_starts_without_a_valid_control_key(tmp_path, fake_tools, key):
    """Without the key, model control (which runs a loaded model's code) would be open to
    whoever reaches the server: the entrypoint refuses to start it, saying what to set."""
    env = {k: v for k, v in fake_tools.items() if k != CONTROL_KEY_ENV}
    if key is not None:
        env[CONTROL_KEY_ENV] = key
    done = _entrypoint(tmp_path, env, check=False)
    assert done.returncode == 2
    assert "tritonserver" not in done.stdout
    assert f"maskops-triton: {CONTROL_KEY_ENV} must be 16 to 128 characters" in done.stderr
