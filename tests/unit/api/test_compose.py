"""docker-compose.yml is coherent: ``docker compose config`` where a Compose client exists,
and in any case the services, images, build files, volumes, healthchecks, dependency
conditions, GPU reservations and env file are checked from the parsed file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from maskops.serving.control import CONTROL_KEY_ENV
from maskops.serving.placement import ENGINE_CACHE_ROOT

REPO = Path(__file__).resolve().parents[3]
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _compose_client() -> list[str]:
    """Debian's ``docker-compose`` (./dev test installs it), else the compose plugin."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if os.environ.get("MASKOPS_REQUIRE_SERVICES") == "1":
        pytest.fail("no compose client: ./dev test installs Debian's docker-compose")
    pytest.skip("no docker compose client here")


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    client = _compose_client()
    shutil.copy(COMPOSE, tmp_path / "docker-compose.yml")
    shutil.copy(ENV_EXAMPLE, tmp_path / ".env")
    result = subprocess.run(
        [*client, "-f", str(tmp_path / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # The client really reads the file: a broken one is refused.
    (tmp_path / "docker-compose.yml").write_text(COMPOSE.read_text() + "\nbroken: [\n")
    broken = subprocess.run(
        [*client, "-f", str(tmp_path / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        timeout=60,
    )
    assert broken.returncode != 0


def test_services_images_and_build_files(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"postgres", "redis", "api", "worker-gpu0", "worker-cpu", "triton"} <= set(services)
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        build = service.get("build")
        if build:
            assert (REPO / build["context"] / build["dockerfile"]).is_file(), name
    triton = services["triton"]["build"]
    dockerfile = (REPO / triton["context"] / triton["dockerfile"]).read_text()
    assert "FROM nvcr.io/nvidia/tritonserver:" in dockerfile


def test_healthchecks_and_dependency_conditions(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert rule["condition"] == "service_healthy", f"{name} -> {dependency}"
    # Migrations run in the API at start; workers wait for it.
    assert set(services["api"]["depends_on"]) == {"postgres", "redis"}
    assert "maskops_api.server" in " ".join(services["api"]["command"])
    for worker in ("worker-gpu0", "worker-cpu"):
        assert "api" in services[worker]["depends_on"]


def test_gpu_workers_reserve_one_gpu_and_run_one_job(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("worker-gpu0", "triton"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    gpu_command = services["worker-gpu0"]["command"]
    assert gpu_command[gpu_command.index("-Q") + 1] == "gpu"
    assert gpu_command[gpu_command.index("-c") + 1] == "1"
    assert gpu_command[gpu_command.index("--prefetch-multiplier") + 1] == "1"
    # The control plane loads what is published; the repository holds unpublished versions.
    assert not any(arg.startswith("--load-model") for arg in services["triton"]["command"])
    cpu_command = services["worker-cpu"]["command"]
    assert cpu_command[cpu_command.index("-Q") + 1] == "cpu"


def test_volumes_are_declared_and_shared(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            if ":" not in volume:
                continue  # anonymous: the container's own
            source = volume.split(":", 1)[0]
            assert source in declared, f"{name} mounts undeclared volume {source}"
    mounts = {
        v for n in ("api", "worker-gpu0", "worker-cpu") for v in compose["services"][n]["volumes"]
    }
    assert {"data:/data", "models:/models"} <= mounts
    services = compose["services"]
    assert all("data:/data" in services[n]["volumes"] for n in ("api", "worker-gpu0", "worker-cpu"))
    # Publish jobs write the model repository on the workers; Triton serves it.
    assert all("models:/models" in services[n]["volumes"] for n in ("worker-gpu0", "worker-cpu"))
    assert "models:/models" in services["triton"]["volumes"]


def test_each_triton_replica_caches_its_engines_in_a_volume_of_its_own(
    compose: dict[str, Any],
) -> None:
    """onnxruntime writes an engine cache file in place: replicas sharing the folder would
    write one file at once. An anonymous volume is each container's own, and outlives its
    restarts."""
    volumes = compose["services"]["triton"]["volumes"]
    assert ENGINE_CACHE_ROOT in volumes
    # The image makes it writable by any user; a new volume there starts as a copy of it.
    dockerfile = (REPO / compose["services"]["triton"]["build"]["dockerfile"]).read_text()
    assert f"chmod 1777 {ENGINE_CACHE_ROOT}" in dockerfile
    for name, service in compose["services"].items():
        if name != "triton":
            assert not [v for v in service.get("volumes", []) if ENGINE_CACHE_ROOT in v]


def test_no_secrets_in_the_file_and_env_example_complete(compose: dict[str, Any]) -> None:
    text = COMPOSE.read_text()
    assert not re.search(r"(?i)(password|secret|token)\s*[:=]\s*\S", text)
    example = dict(
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert {"POSTGRES_PASSWORD", "MASKOPS_DATABASE_URL", "MASKOPS_BROKER_URL"} <= set(example)
    referenced = set(re.findall(r"\$\{(\w+)(?::[-?][^}]*)?\}", text))
    assert referenced <= set(example), referenced - set(example)
    for name in ("postgres", "api", "worker-gpu0", "worker-cpu"):
        assert compose["services"][name]["env_file"] == ".env"


def test_triton_is_reached_by_the_control_plane_alone(compose: dict[str, Any]) -> None:
    """Triton's model control runs code: it publishes no port, serves no gRPC, and gets the
    control key that the API and the workers (env_file .env) hold too."""
    triton = compose["services"]["triton"]
    assert "ports" not in triton and "network_mode" not in triton
    assert not [arg for arg in triton["command"] if arg.startswith("--grpc")]
    key = triton["environment"][CONTROL_KEY_ENV]
    assert key.startswith(f"${{{CONTROL_KEY_ENV}:?")  # compose refuses to start without it
    example = ENV_EXAMPLE.read_text()
    assert re.search(rf"^{CONTROL_KEY_ENV}=\S+$", example, re.MULTILINE)
    for name in ("api", "worker-gpu0", "worker-cpu"):
        assert compose["services"][name]["env_file"] == ".env"


def test_the_build_context_holds_what_every_dockerfile_copies() -> None:
    """.dockerignore leaves out everything but what the Dockerfiles copy: a COPY of a path it
    leaves out would fail only when an image is built."""
    lines = (REPO / ".dockerignore").read_text().splitlines()
    rules = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "an allow-list: everything is left out, then let back in"
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    for dockerfile in sorted((REPO / "services").glob("*/Dockerfile")):
        for line in dockerfile.read_text().splitlines():
            words = line.split()
            if not words or words[0] not in ("COPY", "ADD") or "--from" in line:
                continue
            for source in words[1:-1]:
                top = source.split("/")[0]
                assert top in allowed, f"{dockerfile.relative_to(REPO)}: {source} is left out"
                assert (REPO / source).exists(), f"{dockerfile.relative_to(REPO)}: no {source}"
