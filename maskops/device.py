"""Which device a job runs on, and why CUDA is or is not usable: never a silent CPU fallback.

A torch wheel is built for one CUDA major version and needs an NVIDIA driver at least as new
as that version's minor-version-compatibility floor (:data:`MIN_DRIVER`). On an older driver
``torch.cuda.is_available()`` is simply False, so code that picks "cuda if available else
cpu" trains for hours on the CPU of a GPU host and reports success. Here, a host whose
NVIDIA GPUs are present but unusable, or a process started with ``MASKOPS_REQUIRE_CUDA=1``
(a GPU worker's image sets it), gets :class:`DeviceError` naming the driver and the build
instead of the CPU.

:func:`cuda_report` initialises CUDA. A process that must not (the Celery main process,
whose pool children fork from it) calls :func:`cuda_report_subprocess` instead: where an
NVIDIA driver exists it runs ``python -m maskops.device``, which prints the report as JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

REQUIRE_CUDA_ENV = "MASKOPS_REQUIRE_CUDA"
"""Set to 1 where a job must run on a GPU: without a usable one it fails, saying why."""
NVIDIA_PROC = Path("/proc/driver/nvidia")
"""The Linux driver's folder: ``version`` and one ``gpus/<bus id>`` folder per GPU."""
MIN_DRIVER: dict[int, tuple[int, ...]] = {
    13: (580, 65, 6),
    12: (525, 60, 13),
    11: (450, 80, 2),
}
"""The oldest Linux driver that runs any build of a CUDA major version (CUDA's minor version
compatibility, from the CUDA Toolkit release notes, table "CUDA Toolkit and Minimum Required
Driver Version for CUDA Minor Version Compatibility")."""


class DeviceError(RuntimeError):
    """A GPU was required or present, and CUDA cannot use it; the message says why."""


def parse_version(text: str) -> tuple[int, ...]:
    """``"580.95.05"`` -> ``(580, 95, 5)``."""
    return tuple(int(part) for part in re.findall(r"\d+", text))


def driver_in_proc_text(text: str) -> str | None:
    """The version in ``/proc/driver/nvidia/version``'s text (``NVRM version: NVIDIA UNIX
    x86_64 Kernel Module  580.95.05  Tue ...``, or ``... Open Kernel Module for x86_64  ...``)."""
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version, read without initialising CUDA; None without one."""
    try:
        found = driver_in_proc_text((NVIDIA_PROC / "version").read_text())
    except OSError:
        found = None
    if found:
        return found
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def gpus_present() -> int:
    """The NVIDIA GPUs this process may use (the driver's list, narrowed by
    ``CUDA_VISIBLE_DEVICES``), counted without initialising CUDA."""
    try:
        count = sum(1 for _ in (NVIDIA_PROC / "gpus").iterdir())
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count
    listed = [d for d in visible.split(",") if d.strip()]
    if listed and listed[0].strip() == "-1":
        return 0
    return min(count, len(listed))


def cuda_required() -> bool:
    return os.environ.get(REQUIRE_CUDA_ENV, "").strip().lower() in ("1", "true", "yes")


def diagnose(
    *,
    torch_version: str,
    cuda_build: str | None,
    driver: str | None,
    gpus: int,
    available: bool,
    init_error: str = "",
) -> str:
    """Why CUDA is unusable on a host with ``gpus`` NVIDIA GPUs: ``""`` when it is usable or
    when there is no GPU to use (the caller decides whether a GPU was required)."""
    if available or gpus == 0:
        return ""
    if cuda_build is None:
        return (
            f"torch {torch_version} is a CPU-only build: install a CUDA build of torch "
            "(docs/operations.md, 'GPU hosts')"
        )
    major = parse_version(cuda_build)[0]
    floor = MIN_DRIVER.get(major)
    if driver is not None and floor is not None and parse_version(driver) < floor:
        need = ".".join(str(p) for p in floor)
        return (
            f"NVIDIA driver {driver} is too old for torch {torch_version} (built for CUDA "
            f"{cuda_build}, which needs driver >= {need}): install the torch build for this "
            "driver's CUDA or update the driver (docs/operations.md, 'GPU hosts')"
        )
    detail = f": {init_error}" if init_error else ""
    return (
        f"{gpus} NVIDIA GPU(s) present but CUDA is unusable (driver {driver or 'unknown'}, "
        f"torch {torch_version} built for CUDA {cuda_build}){detail}"
    )


@dataclass(frozen=True)
class CudaReport:
    """What this process can do with CUDA."""

    torch_version: str
    cuda_build: str | None
    """``torch.version.cuda``: the CUDA version torch was built for; None for a CPU build."""
    driver: str | None
    gpus_present: int
    available: bool
    device_count: int
    devices: tuple[str, ...]
    """Each device's name and compute capability, e.g. ``"NVIDIA H100 80GB HBM3 (sm_90)"``."""
    problem: str
    """Why GPUs that are present cannot be used (:func:`diagnose`); empty otherwise."""

    @property
    def usable(self) -> bool:
        return self.available and self.device_count > 0

    def summary(self) -> str:
        """One line for logs, heartbeats and ``/readyz``."""
        if self.problem:
            return f"unusable: {self.problem}"
        if not self.usable:
            return f"no GPU (torch {self.torch_version}, CUDA build {self.cuda_build or 'none'})"
        return (
            f"ok: {self.device_count} GPU(s) {', '.join(self.devices)}; driver {self.driver}, "
            f"torch {self.torch_version} CUDA {self.cuda_build}"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "usable": self.usable, "summary": self.summary()}


NVIDIA_DEVICE_NODES = (Path("/dev/nvidiactl"), Path("/dev/dxg"))
"""Where CUDA reaches a GPU: the Linux driver's control node, or WSL's GPU node."""


def no_nvidia_driver() -> bool:
    """Whether this host has nothing CUDA could reach a GPU through: no NVIDIA driver
    (:data:`NVIDIA_PROC`, ``nvidia-smi``) and no device node. Read without initialising
    CUDA."""
    return (
        not NVIDIA_PROC.exists()
        and not any(node.exists() for node in NVIDIA_DEVICE_NODES)
        and shutil.which("nvidia-smi") is None
    )


def cuda_report() -> CudaReport:
    """Probe this process's CUDA (this initialises it where it works)."""
    init_error = ""
    try:
        available = torch.cuda.is_available()
        if not available and torch.version.cuda is not None and gpus_present():
            torch.cuda.init()  # raises with the runtime's own reason
    except Exception as exc:
        available, init_error = False, str(exc).strip().splitlines()[0]
    count = torch.cuda.device_count() if available else 0
    devices = tuple(
        f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, capability))})"
        for i in range(count)
        for capability in [torch.cuda.get_device_capability(i)]
    )
    return _report(
        driver=driver_version(), gpus=gpus_present(), devices=devices, available=available,
        init_error=init_error,
    )  # fmt: skip


def _report(
    *, driver: str | None, gpus: int, devices: tuple[str, ...], available: bool, init_error: str
) -> CudaReport:
    """This torch build's report of what a probe found (:func:`diagnose` says what is wrong)."""
    return CudaReport(
        torch_version=torch.__version__,
        cuda_build=torch.version.cuda,
        driver=driver,
        gpus_present=gpus,
        available=available,
        device_count=len(devices),
        devices=devices,
        problem=diagnose(
            torch_version=torch.__version__,
            cuda_build=torch.version.cuda,
            driver=driver,
            gpus=gpus,
            available=available,
            init_error=init_error,
        ),
    )


def cuda_report_subprocess(timeout_s: float = 120.0) -> CudaReport:
    """:func:`cuda_report` of a fresh interpreter, leaving this process's CUDA untouched.

    On a host with no NVIDIA driver the report is known without one (no GPU, nothing
    initialised), and a fresh interpreter importing torch costs seconds of CPU: it is made
    here."""
    if no_nvidia_driver():
        return cuda_report_without_a_driver()
    done = subprocess.run(
        [sys.executable, "-m", "maskops.device"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    payload = json.loads(done.stdout)
    payload.pop("usable")
    payload.pop("summary")
    payload["devices"] = tuple(payload["devices"])
    return CudaReport(**payload)


def cuda_report_without_a_driver() -> CudaReport:
    """:func:`cuda_report` of a host without an NVIDIA driver, CUDA untouched: no GPU is
    present, so none is available and nothing is wrong with one."""
    return _report(driver=None, gpus=0, devices=(), available=False, init_error="")


def check_cuda(report: CudaReport | None = None, *, required: bool | None = None) -> CudaReport:
    """``report`` (probed when None) if CUDA can be used or need not be.

    Raises:
        DeviceError: GPUs are present but unusable, or a GPU is required
            (``MASKOPS_REQUIRE_CUDA``) and none is usable.
    """
    report = report or cuda_report()
    required = cuda_required() if required is None else required
    if report.problem:
        raise DeviceError(report.problem)
    if required and not report.usable:
        raise DeviceError(
            f"a GPU is required ({REQUIRE_CUDA_ENV}=1) but none is usable: "
            f"{report.gpus_present} NVIDIA GPU(s) visible, driver {report.driver or 'none'}, "
            f"torch {report.torch_version} built for CUDA {report.cuda_build or 'none (CPU build)'}"
        )
    return report


def select_device(gpu_index: int | None) -> torch.device:
    """``cuda:gpu_index`` where CUDA is usable; the CPU where no GPU exists and none is
    required, or when ``gpu_index`` is None (an explicit CPU run).

    Raises:
        DeviceError: GPUs present but unusable, a GPU required and none usable, or
            ``gpu_index`` out of range.
    """
    if gpu_index is None:
        return torch.device("cpu")
    report = check_cuda()
    if not report.usable:
        return torch.device("cpu")
    if not 0 <= gpu_index < report.device_count:
        raise DeviceError(
            f"--gpu_index {gpu_index} is out of range: {report.device_count} GPU(s) visible"
        )
    return torch.device("cuda", gpu_index)


if __name__ == "__main__":
    print(json.dumps(cuda_report().to_json()))
