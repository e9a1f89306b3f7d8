"""What each serving precision costs in accuracy, on a model that detects.

bench_serving.py times the serving arms on random weights (the worst case: 100 detections
per image), where accuracy means nothing. This takes a trained model and measures, on its
validation set, the COCO box and mask AP of each arm a user could serve it with, and their
latency one validation image at a time (alternated rounds, median and range):

- PyTorch eager fp32, the reference;
- eager bf16 autocast + channels_last (accuracy on any CPU; its latency is reported only
  where the CPU has native bf16 kernels, elsewhere bf16 is emulated and its time means
  nothing);
- onnxruntime on the fp32 export and on the int8 (QDQ) export, both made by
  ``maskops export`` as a user would (int8 calibrated on the training images).

The model is the demo walk's recipe (``maskops_serve.demo``: resnet10 from scratch, 128 px,
small heads) trained here in fp32 for ``--steps`` steps (about 6 minutes idle at the
default), or ``--checkpoint PATH``, a maskops checkpoint whose stored spec's data paths
exist here (your own model on your own validation set).

    .venv/bin/python bench/bench_precision.py --require-idle
    .venv/bin/python bench/bench_precision.py --checkpoint run/model.step-1000.pth

Results: bench/results/bench_precision.json (machine and load recorded; see bench/machine.py).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from machine import start_run, write_results
from timing import alternated_seconds

from maskops.checkpoints.model_file import LoadedModel, load_model
from maskops.data.labels import LabelMap
from maskops.data.pipeline import build_eval_loader
from maskops.evaluation import COCOEvaluator, evaluate_model
from maskops.evaluation.predictor import Predictor, TorchPredictor
from maskops.export.exporter import export_onnx
from maskops.export.predictor import OnnxPredictor
from maskops.spec.models import ExperimentSpec
from maskops.training import run_training
from maskops.training.trainer import cpu_has_native_bf16
from maskops_serve.demo import DEMO_STEPS, prepare_walk_training

RESULTS = Path(__file__).parent / "results" / "bench_precision.json"
REFERENCE = "eager_fp32"


def train_walk_model(work: Path, steps: int) -> Path:
    """The demo walk's recipe in fp32 for ``steps`` steps; returns its checkpoint."""
    walk = prepare_walk_training(work, steps)
    result = run_training(walk.spec.model_copy(update={"use_amp": False}), work / "run")
    assert result.checkpoint is not None
    return result.checkpoint


def serving_arms(checkpoint: Path, loaded: LoadedModel, work: Path) -> dict[str, Predictor]:
    """Every way to serve ``checkpoint`` (``loaded`` is its model) on a CPU, the exports made
    as ``maskops export`` makes them (each validated against PyTorch, int8 calibrated on the
    training shards)."""
    channels_last = copy.deepcopy(loaded.model).to(memory_format=torch.channels_last)
    arms: dict[str, Predictor] = {
        REFERENCE: TorchPredictor(loaded.model),
        "eager_bf16_channels_last": TorchPredictor(channels_last, autocast_dtype=torch.bfloat16),
    }
    for data_type in ("fp32", "int8"):
        export = export_onnx(
            checkpoint,
            None,
            work / f"model.{data_type}.onnx",
            data_type=data_type,
            max_batch_size=1,
            evaluate_int8=False,
            log=lambda _: None,
        )
        arms[f"ort_{data_type}"] = OnnxPredictor(export.onnx_path)
    return arms


def accuracy(predictor: Predictor, spec: ExperimentSpec, label_map: LabelMap) -> dict[str, Any]:
    """COCO box AP and mask AP on the spec's validation set, and how many images it has."""
    evaluator = COCOEvaluator(spec.data_config.val_json_file, label_map, iou_types=("bbox", "segm"))
    loader = build_eval_loader(spec, label_map=label_map, with_masks=False)
    metrics = evaluate_model(predictor, loader, evaluator)
    return {
        "AP": round(metrics["AP"], 4),
        "mask_AP": round(metrics["mask_AP"], 4),
        "images": len(evaluator.image_ids),
    }


def validation_images(spec: ExperimentSpec, label_map: LabelMap, count: int) -> list[torch.Tensor]:
    loader = build_eval_loader(spec, label_map=label_map, with_masks=False, batch_size=1)
    return [images[0] for images, _ in islice(loader, count)]


def latencies(
    arms: dict[str, Predictor], images: Sequence[torch.Tensor], rounds: int
) -> dict[str, dict[str, float]]:
    """Milliseconds to run the validation images one at a time, per image, per arm."""

    def one_at_a_time(predictor: Predictor) -> Callable[[], Any]:
        return lambda: [predictor([image]) for image in images]

    spreads = alternated_seconds([one_at_a_time(p) for p in arms.values()], rounds)
    return {
        name: spread.summary("ms_per_image", scale=1e3 / len(images), digits=2)
        for name, spread in zip(arms, spreads, strict=True)
    }


def compare(
    metrics: dict[str, dict[str, Any]], timing: dict[str, dict[str, float]]
) -> dict[str, dict[str, Any]]:
    """Per arm: its AP, the points it loses against eager fp32, its speed against it and
    against the fastest eager arm."""
    reference = metrics[REFERENCE]
    eager = {n: t["median_ms_per_image"] for n, t in timing.items() if n.startswith("eager")}
    best_eager = min(eager.values())
    rows: dict[str, dict[str, Any]] = {}
    for name, arm in metrics.items():
        row: dict[str, Any] = {
            **arm,
            "mask_AP_drop_points": round(100 * (reference["mask_AP"] - arm["mask_AP"]), 2),
            "box_AP_drop_points": round(100 * (reference["AP"] - arm["AP"]), 2),
        }
        if name in timing:
            ms = timing[name]["median_ms_per_image"]
            row["latency"] = timing[name]
            row["speedup_vs_eager_fp32"] = round(eager[REFERENCE] / ms, 3)
            row["speedup_vs_best_eager"] = round(best_eager / ms, 3)
        rows[name] = row
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a trained maskops checkpoint")
    parser.add_argument("--steps", type=int, default=DEMO_STEPS, help="training steps")
    parser.add_argument("--latency-images", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--require-idle", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    conditions = start_run(require_idle=args.require_idle)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench_precision_") as work:
        figures = measure(args, Path(work))
    write_results(args.out, figures, conditions)


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Accuracy and latency of each serving arm, its exports written under ``work``."""
    checkpoint = args.checkpoint or train_walk_model(work, args.steps)
    loaded = load_model(checkpoint)
    arms = serving_arms(checkpoint, loaded, work)
    metrics = {name: accuracy(arm, loaded.spec, loaded.label_map) for name, arm in arms.items()}
    native_bf16 = cpu_has_native_bf16()
    timed = arms
    if not native_bf16:
        print("eager bf16 latency not measured: this CPU emulates bf16")
        timed = {n: a for n, a in arms.items() if n != "eager_bf16_channels_last"}
    images = validation_images(loaded.spec, loaded.label_map, args.latency_images)
    rows = compare(metrics, latencies(timed, images, args.rounds))
    for name, row in rows.items():
        speed = f", {row['speedup_vs_best_eager']:.2f}x the best eager" if "latency" in row else ""
        print(
            f"{name}: box AP {row['AP']:.3f}, mask AP {row['mask_AP']:.3f} "
            f"({-row['mask_AP_drop_points']:+.1f} points){speed}"
        )
    figures = {
        "model": "demo walk recipe" if args.checkpoint is None else str(args.checkpoint),
        "steps": None if args.checkpoint else args.steps,
        "image_size": list(loaded.spec.data_config.image_size),
        "backbone": f"resnet{loaded.spec.maskrcnn_config.nlayers}",
        "validation_images": metrics[REFERENCE]["images"],
        "latency_images": len(images),
        "native_bf16": native_bf16,
        "arms": rows,
    }
    return figures


if __name__ == "__main__":
    main()
