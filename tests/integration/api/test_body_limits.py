"""Request bodies over a route's limit are refused as they arrive, against a real uvicorn
server process (Postgres, Redis): at once from the Content-Length header, and while
counting a chunked body; nothing is stored and the server's memory stays bounded."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from maskops_core.settings import Settings
from tests.integration.api.conftest import REPO, settings_env

UPLOAD_LIMIT = 8 * 1024**2
MiB = 1024**2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def server(clean_db: Settings, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A uvicorn process serving the app; yields ``(port, pid)``."""
    port = _free_port()
    env = settings_env(clean_db) | {"MASKOPS_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT)}
    log = (tmp_path / "uvicorn.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "maskops_api.main:app", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        else:
            raise AssertionError((tmp_path / "uvicorn.log").read_text())
        yield port, process.pid
    finally:
        process.terminate()
        process.wait(30)


def _status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field (``VmRSS``, ``VmHWM``: peak RSS) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def _response(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def test_declared_length_over_the_limit_is_413_at_once(server: tuple[int, int]) -> None:
    port, _ = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.monotonic()
        sock.sendall(
            b"POST /experiments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1099511627776\r\n\r\n" + b'{"name": "x"'
        )
        answer = _response(sock, timeout=5)
        # Answered without waiting for the terabyte announced (or the rest of the JSON).
        assert answer.startswith(b"HTTP/1.1 413"), answer
        assert time.monotonic() - started < 2


def _send_chunked(port: int, path: str, head: bytes, total: int) -> tuple[bytes, int]:
    """Send ``head`` then zeros as a chunked body until the server answers or ``total``
    bytes are sent; the answer's head and how many bytes went out."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n".encode()
            + head
        )
        chunk = b"\0" * MiB
        framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        try:
            while sent < total:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered
                sock.sendall(framed)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _response(sock, timeout=10), sent


def test_chunked_bodies_stop_at_the_route_limit_with_bounded_memory(
    server: tuple[int, int], clean_db: Settings
) -> None:
    port, pid = server
    rss_before = _status(pid, "VmRSS")
    json_head = b"Content-Type: application/json\r\n\r\n"
    answer, sent = _send_chunked(port, "/experiments", json_head, total=200 * MiB)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert sent < 40 * MiB  # refused near the 1 MiB limit (plus socket buffers)

    boundary = b"XyZ"
    upload_head = b"Content-Type: multipart/form-data; boundary=" + boundary + b"\r\n\r\n"
    # The multipart preamble goes in the first chunk; then 300 MiB of "archive" follow.
    preamble = (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="name"\r\n\r\nbig\r\n'
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="archive"; '
        b'filename="a.tar"\r\nContent-Type: application/octet-stream\r\n\r\n'
    )
    upload_head += f"{len(preamble):x}\r\n".encode() + preamble + b"\r\n"
    answer, sent = _send_chunked(port, "/datasets/upload", upload_head, total=300 * MiB)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert sent < UPLOAD_LIMIT + 40 * MiB
    # Nothing of the refused upload is stored, and the peak memory of the server stayed
    # far below what it was sent.
    uploads = clean_db.data_root / "uploads"
    assert not uploads.exists() or list(uploads.iterdir()) == []
    assert _status(pid, "VmHWM") - rss_before < 64 * MiB
