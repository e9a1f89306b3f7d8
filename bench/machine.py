"""What a benchmark ran on, recorded beside its figures.

The development VMs are handed out on different CPUs from session to session (an AVX2 EPYC,
an AVX-512 BF16 EPYC, a Xeon with AMX), and bf16 and INT8 figures depend on which; results
files that do not say so cannot be compared with each other.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
"""The /proc/cpuinfo flags that decide which CPU kernels torch and onnxruntime use."""


def describe_machine() -> dict[str, Any]:
    """CPU model, its relevant ISA flags, usable cores, torch version and threads, GPU."""
    cpu_model, flags = platform.processor() or platform.machine(), set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu_model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    return {
        "cpu": cpu_model,
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "cpus": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
