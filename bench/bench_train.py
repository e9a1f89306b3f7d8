"""Benchmark: training throughput of maskops' loop against a plain torchvision loop.

Both train the same model (``build_model`` from the same spec, same seed) on the same
synthetic data (demo shapes at ``--image-size``), ``--batch`` images per step:

- torchvision: the plain loop of torchvision's detection references: a default
  ``DataLoader`` over the COCO JSON (pycocotools index, PIL decode, ``annToMask`` polygon
  rasterisation per sample, resize+pad), fp32, NCHW, ``loss.item()`` every step.
- maskops: ``run_training`` (shard pipeline, hooks, metrics every 10 steps) in each
  configuration given by ``--variants``: ``fp32``, ``bf16`` (use_amp: bf16 autocast on
  CPU), ``bf16-cl`` / ``fp32-cl`` (plus channels_last weights and inputs).

Each variant runs in its own process (so peak RSS is its own); images/s is measured over
the steps after ``--warmup``. By default all variants of one backbone run at the same time
with ``--threads`` split between them: on a shared machine whose load changes from minute
to minute, only variants measured under the same load compare (``--sequential`` runs them
one after another with all threads, for a quiet machine). Prints each variant's ratio to
the torchvision loop and writes the figures to ``bench/results/bench_train.json``.

    .venv/bin/python bench/bench_train.py                       # resnet18, a few minutes
    .venv/bin/python bench/bench_train.py --nlayers 18 50 --sequential --steps 8 --warmup 2
    # on a GPU host: the issue's (832, 1344), resnet50, batch 4, with and without AMP
    .venv/bin/python bench/bench_train.py --device cuda --nlayers 50 --image-size 832 1344 \\
        --batch 4 --variants fp32 bf16 --steps 50 --warmup 10
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from machine import describe_machine
from PIL import Image
from pycocotools.coco import COCO
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.functional import pil_to_tensor

from maskops.data.convert import convert_dataset
from maskops.data.demo import generate_demo_dataset
from maskops.data.labels import LabelMap
from maskops.data.transforms import resize_and_pad
from maskops.engine import HookBase, run_training
from maskops.modeling import build_model
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

RESULTS = Path(__file__).resolve().parent / "results" / "bench_train.json"


def make_spec(root: Path, args: argparse.Namespace, *, use_amp: bool) -> ExperimentSpec:
    return ExperimentSpec(
        seed=0,
        use_amp=use_amp,
        total_steps=args.warmup + args.steps,
        train_batch_size=args.batch,
        init_learning_rate=0.002,
        warmup_steps=0,
        data_config=DataConfig(
            image_size=tuple(args.image_size),
            training_file_pattern=f"{root}/shards/train*",
            validation_file_pattern=f"{root}/shards/val*",
            num_classes=4,
            n_workers=args.workers,
            augment_input_data=False,
        ),
        maskrcnn_config=MaskRCNNConfig(nlayers=args.nlayers_one),
    )


def prepare_data(root: Path, args: argparse.Namespace) -> None:
    demo = generate_demo_dataset(
        root / "demo", num_images=args.images, image_size=tuple(args.image_size), seed=0
    )
    convert_dataset(demo.train_images, demo.train_json, root / "shards", workers=1)
    convert_dataset(demo.val_images, demo.val_json, root / "shards", workers=1)


class CocoJsonDataset(Dataset[tuple[torch.Tensor, dict[str, torch.Tensor]]]):
    """The torchvision-references way: pycocotools index, PIL decode, annToMask."""

    def __init__(self, image_dir: Path, ann_file: Path, image_size: tuple[int, int]) -> None:
        self.coco = COCO(str(ann_file))
        self.ids = sorted(self.coco.imgs)
        self.image_dir = image_dir
        self.image_size = image_size
        self.label_map = LabelMap.from_coco_categories(self.coco.loadCats(self.coco.getCatIds()))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        image_id = self.ids[index]
        info = self.coco.imgs[image_id]
        image = pil_to_tensor(Image.open(self.image_dir / info["file_name"]).convert("RGB"))
        anns = [a for a in self.coco.imgToAnns[image_id] if not a.get("iscrowd", 0)]
        padded, scale = resize_and_pad(image, self.image_size)
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        masks = torch.from_numpy(np.stack([self.coco.annToMask(a) for a in anns]))
        h, w = round(masks.shape[1] * scale), round(masks.shape[2] * scale)
        resized = F.interpolate(masks[None].float(), size=(h, w), mode="nearest")[0]
        full = torch.zeros((len(anns), *self.image_size), dtype=torch.uint8)
        full[:, : min(h, self.image_size[0]), : min(w, self.image_size[1])] = resized[
            :, : self.image_size[0], : self.image_size[1]
        ].to(torch.uint8)
        labels = torch.tensor([self.label_map.label_of(a["category_id"]) for a in anns])
        return padded, {"boxes": boxes * scale, "labels": labels, "masks": full}


def _collate(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch, strict=True))


def run_torchvision(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    spec = make_spec(root, args, use_amp=False)
    device = torch.device(args.device)
    dataset = CocoJsonDataset(
        root / "demo" / "images" / "train",
        root / "demo" / "annotations" / "train.json",
        spec.data_config.image_size,
    )
    loader = DataLoader(
        dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers, collate_fn=_collate
    )
    torch.manual_seed(0)
    model = build_model(
        spec.maskrcnn_config, num_classes=4, image_size=spec.data_config.image_size
    ).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.002, momentum=0.9, weight_decay=1e-4)
    model.train()
    total = args.warmup + args.steps
    step, start = 0, 0.0
    while step < total:
        for images, targets in loader:
            if step == args.warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            images = [img.to(device) for img in images]
            targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
            losses = model(images, targets)
            loss = sum(losses.values())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()  # the references log the loss every step
            step += 1
            if step == total:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"images_per_s": args.steps * args.batch / elapsed}


class _StepClock(HookBase):
    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start = 0.0
        self.end = 0.0

    def after_step(self) -> None:
        # after_step of step `warmup` marks the start; the run's final step the end.
        if self.trainer.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self.trainer.iter == self.warmup:
            self.start = now
        self.end = now


def run_maskops(root: Path, args: argparse.Namespace, variant: str) -> dict[str, Any]:
    spec = make_spec(root, args, use_amp=variant.startswith("bf16"))
    clock = _StepClock(args.warmup)
    out = Path(tempfile.mkdtemp(prefix="bench_train_"))
    try:
        run_training(
            spec,
            out,
            extra_hooks=[clock],
            eval_fn=lambda model, step: {},
            channels_last=variant.endswith("-cl"),
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"images_per_s": args.steps * args.batch / (clock.end - clock.start)}


def child(args: argparse.Namespace) -> None:
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    root = Path(args.root)
    if args.variant == "torchvision":
        figures = run_torchvision(root, args)
    else:
        figures = run_maskops(root, args, args.variant)
    rss = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    figures["peak_rss_mb"] = rss / 1024
    print("RESULT " + json.dumps(figures), flush=True)


_PIPES: dict[str, Any] = {
    "stdout": subprocess.PIPE,
    "stderr": subprocess.PIPE,
    "text": True,
}


def _finish(variant: str, process: subprocess.Popen[str]) -> dict[str, Any]:
    stdout, stderr = process.communicate()
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    if process.returncode != 0 or not lines:
        print(stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"variant {variant} failed")
    figures: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlayers", type=int, nargs="+", default=[18])
    parser.add_argument("--image-size", type=int, nargs=2, default=[512, 512])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--images", type=int, default=16, help="demo images generated")
    parser.add_argument("--workers", type=int, default=1, help="loader processes (both loops)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--variants", nargs="+", default=["fp32", "bf16", "bf16-cl"], help="maskops configs"
    )
    parser.add_argument(
        "--sequential", action="store_true", help="one variant at a time, all threads each"
    )
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--nlayers-one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        child(args)
        return

    results: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("variant", "root")},
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "machine": describe_machine(),
        "runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench_train_data_") as tmp:
        root = Path(tmp)
        prepare_data(root, args)
        for nlayers in args.nlayers:
            variants = ["torchvision", *args.variants]
            threads = args.threads if args.sequential else max(1, args.threads // len(variants))
            commands = {}
            for variant in variants:
                command = [sys.executable, __file__, "--variant", variant, "--root", str(root)]
                command += ["--nlayers-one", str(nlayers), "--threads", str(threads)]
                for key in ("image_size", "batch", "steps", "warmup", "images", "workers"):
                    value = getattr(args, key)
                    values = value if isinstance(value, list) else [value]
                    command += [f"--{key.replace('_', '-')}", *map(str, values)]
                commands[variant] = [*command, "--device", args.device]
            runs: dict[str, Any] = {}
            started: dict[str, subprocess.Popen[str]] = {}
            if not args.sequential:
                started = {v: subprocess.Popen(c, **_PIPES) for v, c in commands.items()}
            for variant, command in commands.items():
                process = started.get(variant) or subprocess.Popen(command, **_PIPES)
                runs[variant] = figures = _finish(variant, process)
                print(
                    f"resnet{nlayers} {variant:12s} {figures['images_per_s']:.4f} img/s "
                    f"peak RSS {figures['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
            base = runs["torchvision"]["images_per_s"]
            for variant in args.variants:
                runs[variant]["ratio_vs_torchvision"] = runs[variant]["images_per_s"] / base
                print(
                    f"resnet{nlayers} {variant}: {runs[variant]['ratio_vs_torchvision']:.2f}x "
                    "the torchvision loop"
                )
            results["runs"][f"resnet{nlayers}"] = runs
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
