"""Benchmark: data-parallel scaling, 1 vs N ranks under torchrun (``maskops train --gpus N``).

Each rank count trains the same spec (demo shapes at ``--image-size``, ``--batch`` images
per rank and step, no evaluation until the end) through the command line users run, so
the figures include DDP's gradient all-reduce (gloo on a CPU, NCCL on GPUs). Throughput is
measured from rank 0's ``metrics.jsonl`` (one record per step, ``logging_frequency: 1``)
between step ``--warmup`` and the step before the last (the last step is followed by the
final evaluation and checkpoint). Scaling efficiency is ``images/s per rank`` divided by
the one-rank figure. The rank counts run one after another, each with every core: on a
CPU the ranks share the cores, so per-rank throughput falls with N by construction; on a
GPU host each rank has its own GPU.

    .venv/bin/python bench/bench_scaling.py --require-idle          # CPU, 1 and 2 ranks
    # on a GPU host (not measured here: this machine has no GPU):
    .venv/bin/python bench/bench_scaling.py --ranks 1 2 4 8 --nlayers 50 \\
        --image-size 832 1344 --batch 4 --steps 50 --warmup 10 \\
        --out OUT.json

The row to compare a GPU run with is NVIDIA's published Mask R-CNN training throughput
(``REFERENCE``: 1 and 8 x A100 with AMP); no GPU figure of maskops is recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from machine import start_run, write_results
from synthetic import prepare_shards, throughput_spec

from maskops.spec.models import ExperimentSpec

RESULTS = Path(__file__).resolve().parent / "results" / "bench_scaling.json"
REFERENCE = {
    "source": "NVIDIA's published Mask R-CNN training throughput (PyTorch, AMP, A100)",
    "images_per_s": {"1 x A100": 24, "8 x A100": 209},
    "measured_here": False,
}


def make_spec(root: Path, args: argparse.Namespace) -> ExperimentSpec:
    steps = args.warmup + args.steps + 1
    spec = throughput_spec(
        root,
        steps=steps,
        batch=args.batch,
        image_size=tuple(args.image_size),
        nlayers=args.nlayers,
        workers=args.workers,
    )
    data = spec.data_config.model_copy(update={"eval_samples": 2})
    return spec.model_copy(
        update={"logging_frequency": 1, "num_steps_per_eval": steps, "data_config": data}
    )


def measure(spec_file: Path, ranks: int, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``maskops train --gpus RANKS`` and read its throughput from metrics.jsonl."""
    results = root / f"ranks-{ranks}"
    maskops = Path(sys.executable).with_name("maskops")
    command = [str(maskops), "train", "-e", str(spec_file), "-d", str(results)]
    subprocess.run([*command, "--gpus", str(ranks)], check=True)
    records = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in records if "Total loss" in r}
    first, last = args.warmup, args.warmup + args.steps
    images = (last - first) * args.batch * ranks
    per_s = images / (times[last] - times[first])
    return {"ranks": ranks, "images_per_s": per_s, "images_per_s_per_rank": per_s / ranks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--nlayers", type=int, default=10)
    parser.add_argument("--image-size", type=int, nargs=2, default=[128, 128])
    parser.add_argument("--batch", type=int, default=2, help="images per rank and step")
    parser.add_argument("--steps", type=int, default=8, help="measured steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="loader workers per rank")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--require-idle", action="store_true", help="refuse to run when loaded")
    args = parser.parse_args()

    conditions = start_run(require_idle=args.require_idle)
    with tempfile.TemporaryDirectory(prefix="bench_scaling-") as tmp:
        root = Path(tmp)
        # Enough images that the most ranks read one epoch at most, one shard per rank.
        prepare_shards(
            root,
            train_images=(args.warmup + args.steps + 1) * args.batch * max(args.ranks),
            image_size=tuple(args.image_size),
            num_shards=max(args.ranks),
        )
        spec_file = root / "spec.json"
        spec_file.write_text(make_spec(root, args).model_dump_json())
        rows = [measure(spec_file, ranks, root, args) for ranks in args.ranks]
    base = next((r for r in rows if r["ranks"] == 1), None)
    for row in rows:
        if base:
            row["efficiency"] = row["images_per_s_per_rank"] / base["images_per_s_per_rank"]
        print(
            f"{row['ranks']} rank(s): {row['images_per_s']:.2f} images/s, "
            f"{row['images_per_s_per_rank']:.2f} per rank"
            + (f", efficiency {row['efficiency']:.2f}" if base else "")
        )
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "require_idle")}
    figures = {"settings": settings, "rows": rows, "reference": REFERENCE}
    write_results(args.out, figures, conditions)


if __name__ == "__main__":
    main()
