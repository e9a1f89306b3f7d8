"""Start and stop the Triton Inference Server bundled in the ``nvidia-pytriton`` wheel.

The PyPI build has only the python backend, and it cannot run from site-packages as is
(measured, see docs/architecture.md): the backends folder is copied somewhere writable with the
Python 3.11 stub next to ``libtriton_python.so``, the stub finds its interpreter through
``python3`` on PATH (so the venv's ``bin`` goes first), and the server's bundled libraries
plus libpython come through LD_LIBRARY_PATH. Models are loaded explicitly (model control
"explicit") so that a new version can be loaded before the old one is unloaded.

Model control runs code (a load request may carry a python model's ``model.py``), so the
server listens on loopback unless told otherwise, serves no gRPC (maskops speaks HTTP),
and, given ``restricted_api``, refuses model control and the other administrative
endpoints to requests without the control key's header (``maskops.serving.control``).

Usage::

    with TritonServer(Path("model_repository"), models=["demo"]) as server:
        url = server.http_url  # "127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from maskops.process_groups import dies_with_parent, kill_group, signal_group

PYTHON_TAG = f"{sys.version_info.major}.{sys.version_info.minor}"


class TritonLaunchError(RuntimeError):
    """Triton could not be found, started, or did not become ready."""


def free_port() -> int:
    """A TCP port nobody listens on right now (tests use one per server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pytriton_root() -> Path:
    # Found, not imported: the package's __init__ imports pytriton's own Python API and its
    # dependencies, which the wheel is installed without (services/install-extra).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonLaunchError("nvidia-pytriton is not installed: no bundled tritonserver")
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise TritonLaunchError(f"no tritonserver binary under {root}")
    return root


def prepare_backends(dest: Path) -> Path:
    """Copy the bundled backends to ``dest`` with the python stub in place; return ``dest``.

    Idempotent: an already prepared folder is reused.
    """
    root = _pytriton_root()
    stub_src = root / "python_backend_stubs" / PYTHON_TAG / "triton_python_backend_stub"
    if not stub_src.is_file():
        raise TritonLaunchError(f"no python backend stub for Python {PYTHON_TAG} in {root}")
    stub_dst = dest / "python" / "triton_python_backend_stub"
    if stub_dst.is_file():
        return dest
    shutil.copytree(root / "backends", dest, dirs_exist_ok=True)
    shutil.copy2(stub_src, stub_dst)
    stub_dst.chmod(0o755)
    return dest


def server_environment(python_bin: Path | None = None) -> dict[str, str]:
    """The environment the bundled server and its python stub need; the stub runs the
    ``python3`` of ``python_bin`` (default: this interpreter's folder)."""
    root = _pytriton_root()
    env = dict(os.environ)
    site_packages = root.parent.parent
    libs = [str(sysconfig.get_config_var("LIBDIR")), str(site_packages / "nvidia_pytriton.libs")]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    env["PATH"] = f"{python_bin or Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


class TritonServer:
    """A tritonserver process on ``repository``; ``start()`` returns once it is ready.

    Args:
        repository: the model repository folder.
        models: models to load at start (explicit model control; others load on request).
            None loads every model in the repository; ``maskops serve`` passes ``[]`` and
            loads what is published once the server is up.
        http_port, metrics_port: 0 picks free ports.
        host: the address HTTP and metrics listen on (loopback unless a container's
            network must reach it).
        restricted_api: Triton's ``--http-restricted-api`` argument
            (``maskops.serving.control.restricted_api_argument``), or None for a server
            whose model control is open to whoever reaches ``host``.
        backend_dir: where the prepared backends live (default: a per-user cache folder).
        log_file: server stdout/stderr go here (default: a temporary file, removed when
            the server stops cleanly and kept, for its log, after a failed start or a crash).
        python_bin: the folder whose ``python3`` the python backend's stub runs (default:
            this interpreter's); the stub's interpreter ignores ``PYTHONPATH``, so what the
            models import must be on that Python's own path.
        startup_timeout_s: how long to wait for readiness, model loads included.
    """

    def __init__(
        self,
        repository: Path,
        *,
        models: Sequence[str] | None = None,
        http_port: int = 0,
        metrics_port: int = 0,
        host: str = "127.0.0.1",
        restricted_api: str | None = None,
        backend_dir: Path | None = None,
        log_file: Path | None = None,
        startup_timeout_s: float = 120.0,
        verbose: bool = False,
        python_bin: Path | None = None,
    ) -> None:
        self.repository = Path(repository).resolve()
        self.models = ["*"] if models is None else list(models)
        self.http_port = http_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.host = host
        self.restricted_api = restricted_api
        self.backend_dir = backend_dir or Path(tempfile.gettempdir()) / (
            f"maskops-triton-backends-{os.getuid()}-py{PYTHON_TAG}"
        )
        self.log_file = log_file
        self.startup_timeout_s = startup_timeout_s
        self.verbose = verbose
        self.python_bin = python_bin
        self._process: subprocess.Popen[bytes] | None = None
        self._log_handle: object | None = None
        self._temporary_log = False
        self._failed = False

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint, as tritonclient expects it."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"[{host}]:{self.http_port}" if ":" in host else f"{host}:{self.http_port}"

    def command(self) -> list[str]:
        binary = _pytriton_root() / "bin" / "tritonserver"
        cmd = [
            str(binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.backend_dir}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-grpc=false",
            "--model-control-mode=explicit",
            "--exit-on-error=true",
            "--strict-readiness=true",
        ]
        if self.restricted_api is not None:
            cmd.append(self.restricted_api)
        cmd += [f"--load-model={name}" for name in self.models]
        if self.verbose:
            cmd.append("--log-verbose=1")
        return cmd

    def start(self) -> TritonServer:
        self.launch()
        try:
            self._wait_ready()
        except BaseException:
            self._failed = True
            self.stop()
            raise
        return self

    def launch(self) -> None:
        """Start the process and return at once (a supervisor polls :meth:`is_ready`).

        The server gets SIGTERM when the thread that called this ends (Linux), so call it
        from one that outlives the server (the main thread, a supervising thread).
        """
        if not self.repository.is_dir():
            raise TritonLaunchError(f"model repository {self.repository} is not a directory")
        prepare_backends(self.backend_dir)
        if self.log_file is None:
            handle, name = tempfile.mkstemp(prefix="maskops-triton-", suffix=".log")
            os.close(handle)
            self.log_file = Path(name)
            self._temporary_log = True
        self._failed = False
        log = self.log_file.open("ab")
        self._log_handle = log
        # Its own session: the python backend stubs join the server's process group, which
        # stop() kills as one, also after the server itself died (the stubs outlive it).
        # SIGTERM when its parent dies unstopped: Triton then shuts down, stubs included.
        self._process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_environment(self.python_bin),
            start_new_session=True,
            preexec_fn=dies_with_parent(signal.SIGTERM),
        )

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def poll(self) -> int | None:
        """The exit code once the server exited (it is reaped then), else None."""
        return None if self._process is None else self._process.poll()

    def is_ready(self) -> bool:
        try:
            url = f"http://{self.http_url}/v2/health/ready"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise TritonLaunchError(
                    f"tritonserver exited with code {self._process.returncode} during start; "
                    f"last lines of {self.log_file}:\n{self.log_tail()}"
                )
            if self.is_ready():
                return
            time.sleep(0.2)
        raise TritonLaunchError(
            f"tritonserver not ready after {self.startup_timeout_s:.0f} s; "
            f"last lines of {self.log_file}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        if self.log_file is None or not self.log_file.exists():
            return ""
        text = self.log_file.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (Triton drains in-flight requests), then SIGKILL after ``timeout_s``."""
        process, self._process = self._process, None
        clean = process is not None and not self._failed
        if process is not None:
            if process.poll() is None:
                # The python stubs are children of the server: signal the whole session.
                signal_group(process.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=timeout_s)
            else:
                clean = False  # it had died before it was asked to stop
            # Whatever is left of the group (all of it after a SIGTERM timeout, the stubs
            # of a server that was killed) goes now; the server itself is reaped.
            kill_group(process.pid)
            process.wait()
            clean = clean and process.returncode == 0
        if self._log_handle is not None:
            self._log_handle.close()  # type: ignore[attr-defined]
            self._log_handle = None
        if clean and self._temporary_log and self.log_file is not None:
            # Nothing to read after a clean stop; a suite or a bench starts dozens.
            self.log_file.unlink(missing_ok=True)
            self.log_file, self._temporary_log = None, False

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m maskops.serving.launcher --model-repository DIR``: run in the foreground."""
    parser = argparse.ArgumentParser(prog="maskops-triton", description=__doc__.split("\n")[0])
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--http-restricted-api",
        default=None,
        help="Triton's restricted-API setting, passed through (model control behind a key)",
    )
    parser.add_argument(
        "--load-model",
        action="append",
        default=None,
        dest="models",
        help="model to load at start (repeatable; default: every model in the repository)",
    )
    args = parser.parse_args(argv)
    server = TritonServer(
        args.model_repository,
        models=args.models,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        host=args.host,
        restricted_api=(
            None
            if args.http_restricted_api is None
            else f"--http-restricted-api={args.http_restricted_api}"
        ),
    )
    try:
        server.start()
    except TritonLaunchError as exc:
        print(f"maskops-triton: error: {exc}", file=sys.stderr)
        return 2
    print(f"maskops-triton: ready at http://{server.http_url} (log: {server.log_file})")
    stop = False

    def _on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        while not stop and server.is_running():
            time.sleep(0.5)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
