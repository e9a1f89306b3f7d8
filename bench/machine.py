"""What a benchmark ran on, and under what load, recorded beside its figures.

The development VMs are handed out on different CPUs from session to session (an AVX2 EPYC,
an AVX-512 BF16 EPYC, a Xeon with AMX), and bf16 and INT8 figures depend on which; results
files that do not say so cannot be compared with each other. And a figure taken while
other work shared the cores measures the contention as much as the code (an evaluation
ratio of 82x at load 13.7 on 2 cores was 14x on the idle machine): every results file
records the load average before and after its run and the share of CPU time other
processes took while it ran, and is marked ``"loaded": true`` when the 1-minute load
exceeded the usable cores as it started or other work took more than a quarter of the
CPUs (bench/readme_table.py keeps such figures out of the README). The load average after
a run is recorded but not judged: a benchmark that keeps two cores busy raises it by
itself.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import sys
import time
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


OTHER_WORK_LIMIT = 0.25
"""Largest share of the machine's CPU time that work outside the benchmark may take while
it runs before its figures are marked loaded."""


def descendants_cpu_s() -> float:
    """CPU seconds spent so far by this process's live descendants and the children they
    waited for (``/proc``): a server it started and that server's workers, whose time
    ``RUSAGE_CHILDREN`` holds only once each parent has waited for each child."""
    parents: dict[int, int] = {}
    seconds: dict[int, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        pid = int(stat.parent.name)
        # After the name: state, ppid, ...; utime, stime, cutime, cstime are 11 to 14.
        parents[pid] = int(fields[1])
        seconds[pid] = sum(int(value) for value in fields[11:15]) / ticks
    own, found = {os.getpid()}, True
    while found:
        found = False
        for pid, parent in parents.items():
            if parent in own and pid not in own:
                own.add(pid)
                found = True
    own.discard(os.getpid())
    return sum(seconds[pid] for pid in own)


@dataclass(frozen=True)
class CpuClock:
    """Wall time, CPU time spent by every process (``/proc/stat``) and by this benchmark."""

    wall_s: float
    all_busy_s: float
    own_s: float

    @classmethod
    def now(cls, *, descendants: bool = False) -> CpuClock:
        """The clocks now; ``descendants``: this process's live descendants count as its
        own too (:func:`descendants_cpu_s`)."""
        with Path("/proc/stat").open() as stat:
            # user nice system idle iowait irq softirq steal: all but idle and iowait busy.
            ticks = [int(value) for value in stat.readline().split()[1:9]]
        busy = sum(ticks) - ticks[3] - ticks[4]
        own = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            usage = resource.getrusage(who)
            own += usage.ru_utime + usage.ru_stime
        if descendants:
            own += descendants_cpu_s()
        return cls(time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own)

    def other_work_share(self, later: CpuClock) -> float:
        """Share of all CPUs' time since ``self`` spent outside this benchmark's processes.

        Children count as the benchmark's once waited for (``RUSAGE_CHILDREN``); one still
        running at the end counts as other work, which errs towards marking a run loaded.
        """
        cpus = os.cpu_count() or 1
        wall = max(later.wall_s - self.wall_s, 1e-9)
        other = (later.all_busy_s - self.all_busy_s) - (later.own_s - self.own_s)
        return max(other, 0.0) / (wall * cpus)


@dataclass
class RunConditions:
    """The machine and its load at the start of a run; ``record`` adds the load at the end."""

    machine: dict[str, Any] = field(default_factory=describe_machine)
    load_before: list[float] = field(default_factory=load_average)
    clock: CpuClock = field(default_factory=CpuClock.now)
    ended: CpuClock | None = None

    def end_now(self) -> None:
        """End the run's clock here, while processes it started and does not wait for
        itself still run (a server and its workers): their time counts as the run's own,
        not as other work."""
        self.ended = CpuClock.now(descendants=True)

    def record(self) -> dict[str, Any]:
        """The run's conditions; loaded when the machine was busy as it started, or when
        other work took more than ``OTHER_WORK_LIMIT`` of the CPUs while it ran (the load
        average after a run counts the benchmark's own processes, so it cannot say)."""
        other_share = self.clock.other_work_share(self.ended or CpuClock.now())
        return {
            "command": shlex.join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
            "machine": self.machine,
            "load_average": {"before": self.load_before, "after": load_average()},
            "other_work_share": round(other_share, 3),
            "loaded": self.load_before[0] > self.machine["cpus"] or other_share > OTHER_WORK_LIMIT,
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
            f"warning: load average {document['load_average']} (usable cores "
            f"{conditions.machine['cpus']}), other work {document['other_work_share']:.0%} of "
            f"the CPUs during the run: {path.name} is marked loaded",
            file=sys.stderr,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"figures written to {path}")
