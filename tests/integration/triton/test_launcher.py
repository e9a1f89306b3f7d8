"""The Triton launcher: health-checked start, clean stop, clear errors."""

from __future__ import annotations

import urllib.request

import pytest

from maskops_triton.launcher import TritonLaunchError, TritonServer

pytestmark = pytest.mark.integration


def test_start_ready_stop(tmp_path):
    server = TritonServer(tmp_path)
    with server:
        assert server.is_running()
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready") as response:
            assert response.status == 200
        assert "--model-control-mode=explicit" in server.command()
    assert not server.is_running()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=2)


def test_failed_start_reports_the_log(tmp_path):
    with pytest.raises(TritonLaunchError, match="not a directory"):
        TritonServer(tmp_path / "missing").start()
    # A model that cannot load makes the server exit (exit-on-error): the log says why.
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 0\n')
    with pytest.raises(TritonLaunchError, match="broken"):
        TritonServer(tmp_path, models=["broken"], startup_timeout_s=60).start()
