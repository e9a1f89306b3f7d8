"""Where a training step's time goes: torch.profiler over a few steps of ``run_training``.

bench/bench_train.py's maskops arm (the same synthetic data, spec and defaults) trains
``--warmup`` steps, then ``--steps`` steps are profiled (CPU activity, and CUDA's on a
GPU), then one step whose host reads are counted, then one more step, so that the
end-of-run checkpoint and finiteness check stay outside both.
Reported, per profiled step:

- ``step_ms``: wall time;
- ``gpu_busy_fraction`` (CUDA only): the time at least one kernel ran, over the wall time.
  Well under 1, the GPU waits for the host: launches, the loader, or synchronisations;
- ``item_calls`` (``aten::_local_scalar_dense``: ``.item()``, ``bool(tensor)``, ``int()``
  of a tensor) and ``cuda_syncs`` (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``):
  each makes the host wait for the device;
- ``top_cpu_ops`` and ``top_gpu_kernels``: the most self time, in ms;
- ``host_reads``: the calls of the step after the window that would make the host wait for
  a GPU, by name (``maskops.training.host_reads``; counted outside the profiled steps,
  whose timing the counting would slow). On a CPU the NMS of more than 1,000 boxes loops
  over the FPN levels (torchvision's choice there, faster on a CPU), one read each; a GPU
  runs one NMS per image.
- ``operators``: the operators that step dispatched (views included): the host's work,
  which bounds the step's speed when the GPU outruns it;
- ``kernel_launches`` (CUDA only): ``cudaLaunchKernel`` and its kin per profiled step.

    .venv/bin/python bench/profile_train.py                      # resnet18, 512², a CPU
    python bench/profile_train.py --device cuda --nlayers 50 --image-size 832 1344 --batch 4
    # writes profile_train.json (profile_train_cuda.json with --device cuda) in results/

bench/gpu_check.py runs it as its ``train_profile`` step.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from machine import start_run, write_results
from synthetic import HEADS, prepare_shards, throughput_spec

from maskops.training import HookBase, run_training
from maskops.training.host_reads import HostReadCounter

RESULTS = Path(__file__).resolve().parent / "results" / "profile_train.json"
TOP = 8
"""Ops and kernels listed, most self time first."""
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


class ProfileWindow(HookBase):
    """Profiles the optimizer steps after step ``warmup`` up to ``warmup + steps``, the
    device synchronised at both ends (so the window holds exactly their work)."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps
        self.profiler: torch.profiler.profile | None = None
        self.started = self.seconds = 0.0
        self.reads: HostReadCounter | None = None

    def before_step(self) -> None:
        if self.trainer.iter == self.warmup + self.steps:  # the step after the window
            self.reads = HostReadCounter().__enter__()

    def after_step(self) -> None:
        device = self.trainer.device
        if self.reads is not None and self.trainer.iter == self.warmup + self.steps + 1:
            self.reads.__exit__(None, None, None)
        if self.trainer.iter == self.warmup:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize(device)
            # One cycle: acc_events only quiets torch's warning that a next one would clear it.
            self.profiler = torch.profiler.profile(activities=activities, acc_events=True)
            self.profiler.start()
            self.started = time.perf_counter()
        elif self.profiler is not None and self.trainer.iter == self.warmup + self.steps:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            self.seconds = time.perf_counter() - self.started
            self.profiler.stop()


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` ((start, end) pairs): kernels on several
    streams that overlap count once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarise(window: ProfileWindow, *, cuda: bool) -> dict[str, Any]:
    """Per-step figures of a finished window (module docstring)."""
    if window.profiler is None or window.seconds <= 0:
        raise RuntimeError(
            f"the profile window never closed: {window.steps} steps after "
            f"step {window.warmup} did not run"
        )
    steps = window.steps
    events = window.profiler.events()
    cpu_ms: dict[str, float] = defaultdict(float)
    kernel_ms: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    kernels: list[tuple[float, float]] = []
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.append((event.time_range.start, event.time_range.end))
            kernel_ms[event.name[:100]] += event.time_range.elapsed_us() / 1000
        else:
            cpu_ms[event.name] += event.self_cpu_time_total / 1000
            counts[event.name] += 1

    def top(table: dict[str, float]) -> list[list[Any]]:
        ranked = sorted(table.items(), key=lambda item: -item[1])[:TOP]
        return [[name, round(ms / steps, 3)] for name, ms in ranked]

    wall_us = window.seconds * 1e6
    return {
        "steps": steps,
        "step_ms": round(window.seconds * 1000 / steps, 2),
        "gpu_busy_fraction": round(busy_us(kernels) / wall_us, 3) if cuda else None,
        "item_calls": round(counts["aten::_local_scalar_dense"] / steps, 1),
        "cuda_syncs": round(sum(counts[name] for name in SYNCS) / steps, 1),
        "kernel_launches": round(sum(counts[name] for name in LAUNCHES) / steps, 1)
        if cuda
        else None,
        "top_cpu_ops": top(cpu_ms),
        "top_gpu_kernels": top(kernel_ms) if cuda else [],
        "host_reads": dict(window.reads.by_call) if window.reads is not None else None,
        "operators": window.reads.operators if window.reads is not None else None,
    }


def profile(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Train on ``prepare_shards(root)``' data, profiling ``args.steps`` steps after
    ``args.warmup``; the figures of :func:`summarise`."""
    spec = throughput_spec(
        root,
        steps=args.warmup + args.steps + 2,
        batch=args.batch,
        image_size=tuple(args.image_size),
        nlayers=args.nlayers,
        workers=args.workers,
        use_amp=args.amp,
        heads=getattr(args, "heads", "tao"),
    )
    window = ProfileWindow(args.warmup, args.steps)
    out = Path(tempfile.mkdtemp(prefix="profile_train_"))
    try:
        run_training(spec, out, extra_hooks=[window], eval_fn=lambda model, step: {})
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return summarise(window, cuda=args.device == "cuda")


def profile_on_demo_data(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`profile` on demo shapes generated for the run in a temporary folder."""
    images = (args.warmup + args.steps + 2) * args.batch
    with tempfile.TemporaryDirectory(prefix="profile_train_data_") as tmp:
        prepare_shards(Path(tmp), train_images=images, image_size=tuple(args.image_size))
        return profile(Path(tmp), args)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlayers", type=int, default=18)
    parser.add_argument("--image-size", type=int, nargs=2, default=[512, 512])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the window")
    parser.add_argument("--workers", type=int, default=1, help="loader processes")
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--heads", default="tao", choices=sorted(HEADS), help="RoI/RPN heads")
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.device == "cpu":  # run_training takes a GPU wherever one is visible
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    conditions = start_run()
    config = {k: v for k, v in vars(args).items() if k != "out"}
    figures = {"config": config, **profile_on_demo_data(args)}
    print(f"{figures['step_ms']} ms a step; GPU busy {figures['gpu_busy_fraction']}")
    print(f"host reads in a step: {figures['host_reads']}")
    print(f"operators dispatched in a step: {figures['operators']}")
    for name, ms in figures["top_cpu_ops"]:
        print(f"  cpu  {ms:9.3f} ms  {name}")
    for name, ms in figures["top_gpu_kernels"]:
        print(f"  gpu  {ms:9.3f} ms  {name}")
    default = RESULTS.with_name("profile_train_cuda.json") if args.device == "cuda" else RESULTS
    write_results(args.out or default, figures, conditions)


if __name__ == "__main__":
    main()
