"""maskops.device: the device a job runs on, and why CUDA is unusable, never a silent CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from maskops import device
from maskops.device import (
    REQUIRE_CUDA_ENV,
    DeviceError,
    check_cuda,
    cuda_report,
    cuda_report_subprocess,
    diagnose,
    driver_in_proc_text,
    select_device,
)
from maskops_core.settings import Settings


def on_one_gpu(**kwargs: Any) -> str:
    """:func:`diagnose` on a host with one NVIDIA GPU and torch 2.14's CUDA 13 build."""
    return diagnose(torch_version="2.14.0+cu130", gpus=1, **kwargs)


def test_diagnose_names_the_driver_and_the_build_that_do_not_fit() -> None:
    old_driver = on_one_gpu(cuda_build="13.0", driver="570.86.15", available=False)
    assert "NVIDIA driver 570.86.15 is too old" in old_driver
    assert "CUDA 13.0, which needs driver >= 580.65.6" in old_driver
    # The same driver runs any CUDA 12 build (minor version compatibility).
    other = on_one_gpu(cuda_build="12.8", driver="570.86.15", available=False)
    assert "too old" not in other and "CUDA is unusable" in other
    cpu_build = on_one_gpu(cuda_build=None, driver="580.95.05", available=False)
    assert "CPU-only build" in cpu_build
    reason = on_one_gpu(
        cuda_build="13.0", driver="580.95.05", available=False, init_error="no CUDA-capable"
    )
    assert reason.endswith(": no CUDA-capable") and "driver 580.95.05" in reason
    # Usable, or no GPU at all: nothing to report.
    assert on_one_gpu(cuda_build="13.0", driver="580.95.05", available=True) == ""
    assert (
        diagnose(torch_version="2.14", cuda_build="13.0", driver=None, gpus=0, available=False)
        == ""
    )


def test_driver_version_is_read_from_the_kernel_modules_text() -> None:
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Oct 14 2025\n"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release"
    assert driver_in_proc_text(proprietary) == "580.95.05"
    assert driver_in_proc_text(open_module) == "570.133.20"
    assert driver_in_proc_text("GCC version: gcc 12") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a host without a usable GPU")
def test_a_required_gpu_that_is_not_there_fails_instead_of_running_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(REQUIRE_CUDA_ENV, raising=False)
    assert select_device(0) == torch.device("cpu")  # a CPU host: the CPU is the product
    monkeypatch.setenv(REQUIRE_CUDA_ENV, "1")
    with pytest.raises(DeviceError, match="a GPU is required") as raised:
        select_device(0)
    assert f"built for CUDA {torch.version.cuda or 'none (CPU build)'}" in str(raised.value)
    assert "driver" in str(raised.value)
    assert select_device(None) == torch.device("cpu")  # an explicit CPU run stays allowed


def test_the_report_of_a_fresh_interpreter_is_this_process_report() -> None:
    here = cuda_report()
    there = cuda_report_subprocess()
    assert there == here
    printed = json.loads(
        subprocess.run(
            [sys.executable, "-m", "maskops.device"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert printed["summary"] == here.summary() and printed["usable"] == here.usable
    assert check_cuda(here, required=False) is here


@pytest.mark.skipif(not device.no_nvidia_driver(), reason="checks a host without a driver")
def test_without_a_driver_the_report_is_made_in_process_and_equals_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A worker's start on a CPU host skips the fresh interpreter (seconds of CPU)."""
    with monkeypatch.context() as patched:
        patched.setattr(device.subprocess, "run", _no_process)
        without = cuda_report_subprocess()
    with monkeypatch.context() as patched:
        patched.setattr(device, "no_nvidia_driver", lambda: False)
        assert cuda_report_subprocess() == without  # the fresh interpreter's
    # A driver's folder, a device node or nvidia-smi sends the probe to a fresh one.
    monkeypatch.setattr(device, "NVIDIA_PROC", tmp_path)
    assert not device.no_nvidia_driver()
    monkeypatch.setattr(device, "NVIDIA_PROC", tmp_path / "absent")
    assert device.no_nvidia_driver()
    monkeypatch.setattr(device, "NVIDIA_DEVICE_NODES", (tmp_path,))
    assert not device.no_nvidia_driver()


def _no_process(*args: Any, **kwargs: Any) -> None:
    raise AssertionError(f"a process was started: {args}")


def test_the_worker_setting_and_the_engine_read_the_same_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REQUIRE_CUDA_ENV, "1")
    assert Settings().require_cuda is True
