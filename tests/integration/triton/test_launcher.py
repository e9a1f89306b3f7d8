"""The Triton launcher: health-checked start, clean stop, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from maskops.serving.launcher import TritonLaunchError, TritonServer
from tests.support.triton_toy import toy_model

pytestmark = pytest.mark.integration


def test_start_ready_stop(tmp_path):
    server = TritonServer(tmp_path)
    with server:
        assert server.is_running()
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready") as response:
            assert response.status == 200
        assert "--model-control-mode=explicit" in server.command()
        log = server.log_file
        assert log is not None and log.is_file()
    assert not server.is_running()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=2)
    # The temporary log goes with a clean stop; a log the caller named stays.
    assert not log.exists()
    named = tmp_path / "named.log"
    with TritonServer(tmp_path, log_file=named):
        pass
    assert named.stat().st_size > 0


def test_failed_start_reports_the_log(tmp_path):
    with pytest.raises(TritonLaunchError, match="not a directory"):
        TritonServer(tmp_path / "missing").start()
    # A model that cannot load makes the server exit (exit-on-error): the log says why,
    # and the temporary log it names stays for whoever looks into it.
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 0\n')
    server = TritonServer(tmp_path, models=["broken"], startup_timeout_s=60)
    with pytest.raises(TritonLaunchError, match="broken") as failure:
        server.start()
    assert server.log_file is not None and str(server.log_file) in str(failure.value)
    assert "broken" in server.log_file.read_text()
    server.log_file.unlink()


def _group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_a_killed_parent_takes_the_server_and_its_stubs_along(tmp_path, tmp_path_factory):
    """A process that dies without stop() (SIGKILL, a CI timeout) leaves no Triton behind."""
    toy_model(tmp_path, "echo")
    # A killed launcher keeps its log: in the test's folders, not in /tmp.
    log = tmp_path_factory.mktemp("log") / "triton.log"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import time
            from pathlib import Path
            from maskops.serving.launcher import TritonServer
            log = Path({str(log)!r})
            server = TritonServer(Path({str(tmp_path)!r}), models=["echo"], log_file=log)
            print(server.start().pid, flush=True)
            time.sleep(600)
        """),
        ],
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    server = int(parent.stdout.readline())
    try:
        assert len(_group(server)) >= 2  # the server and the echo model's python stub
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 60
        while _group(server) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _group(server) == []
    finally:
        if _group(server):
            os.killpg(server, 9)
