"""The API as deployed (``python -m maskops_api.server``, a process of its own), started
for a benchmark on a free port, reached through loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_api(
    env: Mapping[str, str], *, host: str = "127.0.0.1"
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the API with ``env`` (``MASKOPS_*`` settings) over this environment, listening
    on ``host`` (``0.0.0.0`` as in production, where auth is then required); return the
    process and its loopback base URL at once (see :func:`wait_ready`)."""
    port = free_port()
    full_env = {**os.environ, **env, "MASKOPS_HOST": host, "MASKOPS_PORT": str(port)}
    process = subprocess.Popen([sys.executable, "-m", "maskops_api.server"], env=full_env, cwd=REPO)
    return process, f"http://127.0.0.1:{port}"


def wait_ready(process: subprocess.Popen[bytes], base: str, *, timeout_s: float = 60.0) -> None:
    """Return once ``/healthz`` answers. The caller terminates the process.

    Raises:
        RuntimeError: the API exited or did not answer within ``timeout_s`` (it is stopped).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.terminate()
    process.wait(30)
    raise RuntimeError(f"the API did not answer /healthz within {timeout_s:.0f} s")


def start_api(
    env: Mapping[str, str], *, host: str = "127.0.0.1", timeout_s: float = 60.0
) -> tuple[subprocess.Popen[bytes], str]:
    """:func:`launch_api`, then :func:`wait_ready`: the process and its base URL."""
    process, base = launch_api(env, host=host)
    wait_ready(process, base, timeout_s=timeout_s)
    return process, base
