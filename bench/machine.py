"""What a benchmark ran on, and under what load, recorded beside its figures.

The development VMs are handed out on different CPUs from session to session (an AVX2 EPYC,
an AVX-512 BF16 EPYC, a Xeon with AMX), and bf16 and INT8 figures depend on which; results
files that do not say so cannot be compared with each other. And a figure taken while
other work shared the cores measures the contention as much as the code (an evaluation
ratio of 82x at load 13.7 on 2 cores was 14x on the idle machine): every results file
records the load average before and after its run, and is marked ``"loaded": true`` when
the 1-minute load exceeded the usable cores (bench/readme_table.py keeps such figures out
of the README).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import dataclass, field
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
        "cpus": usable_cores(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages."""
    return [round(value, 2) for value in os.getloadavg()]


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


@dataclass
class RunConditions:
    """The machine and its load at the start of a run; ``record`` adds the load at the end."""

    machine: dict[str, Any] = field(default_factory=describe_machine)
    load_before: list[float] = field(default_factory=load_average)

    def record(self) -> dict[str, Any]:
        after = load_average()
        cores = self.machine["cpus"]
        return {
            "command": shlex.join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
            "machine": self.machine,
            "load_average": {"before": self.load_before, "after": after},
            "loaded": max(self.load_before[0], after[0]) > cores,
        }


def start_run(*, require_idle: bool = False) -> RunConditions:
    """Note the machine and load; with ``require_idle`` refuse to start on a loaded machine."""
    conditions = RunConditions()
    load, cores = conditions.load_before[0], conditions.machine["cpus"]
    if load > cores:
        message = f"1-minute load average {load} exceeds the {cores} usable cores"
        if require_idle:
            raise SystemExit(f"{message}: not measuring (wait for an idle machine)")
        print(f"warning: {message}; the figures will be marked loaded", file=sys.stderr)
    return conditions


def write_results(path: Path, figures: dict[str, Any], conditions: RunConditions) -> None:
    """Write ``figures`` with the machine and load to ``path`` (JSON)."""
    document = {**figures, **conditions.record()}
    if document["loaded"]:
        print(
            f"warning: load average {document['load_average']} exceeded the "
            f"{conditions.machine['cpus']} usable cores: {path.name} is marked loaded",
            file=sys.stderr,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"figures written to {path}")
