"""Benchmark: training throughput of maskops' loop against a plain torchvision loop, like for like.

Both train the same network (``build_model`` from the same spec, same seed, same initial
weights) on the same synthetic data (demo shapes at ``--image-size``), ``--batch`` images
per step, with the same precision. Arms:

- ``torchvision-fp32``: the plain loop of torchvision's detection references on the
  network as torchvision's own code computes it (``with_torchvision_parts``): the RoI
  poolers are torchvision's stock ``MultiScaleRoIAlign`` (maskops' pooler computes the
  same features, its CPU backward by a multi-threaded gather), and the RPN and RoI heads
  match, sample and filter with torchvision's per-image code (maskops' reads the device
  less), a ``DataLoader`` over the COCO JSON (pycocotools index, PIL
  decode, ``annToMask`` polygon rasterisation per sample, resize+pad) with persistent
  workers, NCHW, ``loss.item()`` every step.
- ``maskops-fp32``: ``run_training`` (shard pipeline, hooks, metrics every 10 steps;
  channels_last on a CPU and an Ampere or later GPU, ``trains_channels_last``).
- ``torchvision-amp`` / ``maskops-amp``: the same two with the autocast maskops' ``use_amp``
  picks for the device (``AmpSettings``: bf16 on a CPU with native bf16 kernels; on CUDA
  bf16 where the GPU has it, else fp16 with a GradScaler), the baseline with exactly the
  same autocast and scaler. On a CPU without native bf16 maskops declines AMP, so these
  arms are skipped with a message.
- ``maskops-<precision>-<variant>``: maskops' arm with one of its device switches
  (``DeviceTuning``) flipped from its default: ``nopin`` (batches not pinned), ``bench``
  (cuDNN benchmark on), ``nchw`` (channels_last off), ``fused`` (fused SGD), ``tf32``
  (TF32 matmuls), ``u8`` (uint8 images, divided on the device), ``prefetch`` (the next
  batch copied on a side CUDA stream), ``compact`` (masks cropped to their boxes),
  ``compile`` (backbone and FPN under ``torch.compile``, default mode; its first step
  compiles, inside the warm-up), ``nmsbatch`` (one RPN NMS call for the batch),
  ``segnms`` (every image's and FPN level's RPN NMS settled side by side),
  ``graphs`` (the backbone and FPN's forward and backward captured once and replayed as
  CUDA graphs: two launches a step instead of hundreds; CUDA only).
  Not run by default; on a GPU, ``tuning_vs_default`` gives each one's images/s over the
  default's, per round: above 1, the default loses (bench/gpu_check.py runs them). A
  variant arm that fails is recorded with its error under ``failed_arms`` and not run
  again; the other arms go on.

``--heads tiny`` gives both loops CI's small RoI and RPN heads (``synthetic.HEADS``) in
place of TAO's: the same paths at a fraction of a CPU step's cost, for the tests.

Enough images are generated that neither loader starts a second epoch (or restarts its
workers) inside the run. Each arm runs in its own process (its peak RSS, or peak CUDA
memory, is its own), one at a time with every thread, once per round for ``--rounds``
rounds (bench/timing.py): images/s over the steps after ``--warmup``, median and range.
Each arm's mean training loss per round is recorded too: both train the same network from
the same weights at the same learning rate, so they agree within what the two loaders'
sample orders make them differ (tests/unit/test_bench_scripts.py checks one step's losses
and gradients are equal on the same batch).
Figures go to ``bench/results/bench_train.json`` (``bench_train_cuda.json`` with
``--device cuda``; ``--out`` elsewhere).

    .venv/bin/python bench/bench_train.py                       # resnet18, 512², ~15 min
    .venv/bin/python bench/bench_train.py --image-size 256 256 --steps 6 --warmup 2
    # on a GPU host: resnet50 at 832x1344, batch 4, fp32 and AMP arms
    .venv/bin/python bench/bench_train.py --device cuda --nlayers 50 --image-size 832 1344 \\
        --batch 4 --steps 50 --warmup 10          # writes bench_train_cuda.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from machine import start_run, write_results
from PIL import Image
from pycocotools.coco import COCO
from synthetic import HEADS, prepare_shards, throughput_spec
from timing import Spread, alternate
from torch.utils.data import DataLoader, Dataset
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.roi_heads import RoIHeads
from torchvision.models.detection.rpn import RegionProposalNetwork
from torchvision.ops import MultiScaleRoIAlign
from torchvision.transforms.functional import pil_to_tensor

from maskops.data.labels import LabelMap
from maskops.data.transforms import resize_and_pad
from maskops.modeling import build_model
from maskops.modeling.roi_heads import SpecRoIHeads
from maskops.modeling.rpn import TrainTestRPN
from maskops.spec.models import ExperimentSpec
from maskops.training import HookBase, run_training
from maskops.training.trainer import AmpSettings, DeviceTuning

RESULTS = Path(__file__).resolve().parent / "results" / "bench_train.json"
ARMS = ("torchvision-fp32", "maskops-fp32", "torchvision-amp", "maskops-amp")
VARIANTS = {
    "nopin": DeviceTuning(pin_memory=False),
    "bench": DeviceTuning(cudnn_benchmark=True),
    "nchw": DeviceTuning(channels_last=False),
    "fused": DeviceTuning(fused_optimizer=True),
    "tf32": DeviceTuning(tf32_matmul=True),
    "u8": DeviceTuning(uint8_images=True),
    "prefetch": DeviceTuning(prefetch_stream=True),
    "compact": DeviceTuning(compact_masks=True),
    "compile": DeviceTuning(compiled_backbone="default"),
    "nmsbatch": DeviceTuning(one_nms_per_batch=True),
    "segnms": DeviceTuning(segmented_nms=True),
    "graphs": DeviceTuning(graphed_backbone=True),
}
"""maskops arms with one device switch flipped from its default."""
VARIANT_ARMS = tuple(f"maskops-{p}-{v}" for p in ("fp32", "amp") for v in VARIANTS)


def make_spec(root: Path, args: argparse.Namespace, *, use_amp: bool) -> ExperimentSpec:
    return throughput_spec(
        root,
        steps=args.warmup + args.steps,
        batch=args.batch,
        image_size=tuple(args.image_size),
        nlayers=args.nlayers,
        workers=args.workers,
        use_amp=use_amp,
        augment=coco_shaped(args),
        heads=getattr(args, "heads", "tao"),
    )


def coco_shaped(args: argparse.Namespace) -> bool:
    """Whether the run trains on COCO-shaped data (``--coco-shaped``; callers that build
    their own namespace may leave it out)."""
    return bool(getattr(args, "coco_shaped", False))


def train_images(args: argparse.Namespace) -> int:
    """Training images that cover every step: no second epoch inside the run."""
    return (args.warmup + args.steps) * args.batch


class CocoJsonDataset(Dataset[tuple[torch.Tensor, dict[str, torch.Tensor]]]):
    """The torchvision-references way: pycocotools index, PIL decode, annToMask."""

    def __init__(
        self, image_dir: Path, ann_file: Path, image_size: tuple[int, int], flip: bool = False
    ) -> None:
        self.flip = flip
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
        target = {"boxes": boxes * scale, "labels": labels, "masks": full}
        if self.flip and torch.rand(()) < 0.5:  # the references' RandomHorizontalFlip
            padded, target = _flip(padded, target, width=min(w, self.image_size[1]))
        return padded, target


def _flip(
    image: torch.Tensor, target: dict[str, torch.Tensor], *, width: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mirror the ``width`` image columns left-right (the padding stays on the right)."""
    image = image.clone()
    image[:, :, :width] = image[:, :, :width].flip(-1)
    masks = target["masks"].clone()
    masks[:, :, :width] = masks[:, :, :width].flip(-1)
    boxes = target["boxes"].clone()
    boxes[:, [0, 2]] = width - target["boxes"][:, [2, 0]]
    return image, {**target, "boxes": boxes, "masks": masks}


def with_torchvision_parts(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with torchvision's own code where maskops computes the same thing its own
    way: the stock ``MultiScaleRoIAlign`` as the box and mask poolers, and the RPN's and
    the RoI heads' matching, sampling, proposal filtering and losses, one image at a time
    with ``torch.where`` (maskops' run in fixed shapes, without reading the device).

    None of them holds weights, and on the same samples they compute the same losses
    (tests/unit/test_bench_scripts.py): the network, its initial weights and its outputs
    stay the same. The RoI heads keep the spec's three-threshold matcher (TF's rule).
    """
    heads, rpn = model.roi_heads, model.rpn
    assert isinstance(heads, SpecRoIHeads) and isinstance(rpn, TrainTestRPN)
    for name in ("box_roi_pool", "mask_roi_pool"):
        pooler = getattr(heads, name, None)
        if pooler is not None:
            stock = MultiScaleRoIAlign(
                pooler.featmap_names, pooler.output_size, pooler.sampling_ratio
            )
            setattr(heads, name, stock)
    matcher = rpn.proposal_matcher
    rpn.proposal_matcher = det_utils.Matcher(
        matcher.high_threshold, matcher.low_threshold, allow_low_quality_matches=True
    )
    for part in (rpn, heads):
        sampler = part.fg_bg_sampler
        part.fg_bg_sampler = det_utils.BalancedPositiveNegativeSampler(
            sampler.batch_size_per_image, sampler.positive_fraction
        )
    # Instance attributes shadow the subclasses' overrides with torchvision's methods.
    for name in ("filter_proposals", "assign_targets_to_anchors", "compute_loss"):
        setattr(rpn, name, types.MethodType(getattr(RegionProposalNetwork, name), rpn))
    for name in ("assign_targets_to_proposals", "select_training_samples"):
        setattr(heads, name, types.MethodType(getattr(RoIHeads, name), heads))
    return model


def _collate(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch, strict=True))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_torchvision(
    root: Path, args: argparse.Namespace, *, use_amp: bool
) -> tuple[float, list[float]]:
    """The references' loop for ``warmup + steps`` steps: images/s after the warm-up, and
    every step's total loss."""
    spec = make_spec(root, args, use_amp=use_amp)
    device = torch.device(args.device)
    amp = AmpSettings.for_device(device, enabled=use_amp)
    scaler = torch.amp.GradScaler(device.type) if amp.needs_scaler else None
    dataset = CocoJsonDataset(
        root / "demo" / "images" / "train",
        root / "demo" / "annotations" / "train.json",
        spec.data_config.image_size,
        flip=coco_shaped(args),
    )
    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        collate_fn=_collate,
    )
    torch.manual_seed(0)
    model = with_torchvision_parts(
        build_model(spec.maskrcnn_config, num_classes=4, image_size=spec.data_config.image_size)
    ).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.002, momentum=0.9, weight_decay=1e-4)
    model.train()
    batches = iter(loader)  # one epoch covers the run (train_images): no restart
    start = 0.0
    step_losses = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            _synchronize(device)
            start = time.perf_counter()
        images, targets = next(batches)
        images = [img.to(device) for img in images]
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        with amp.autocast():
            losses = model(images, targets)
        loss = sum(losses.values())
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        step_losses.append(loss.item())  # the references log the loss every step
    _synchronize(device)
    return args.steps * args.batch / (time.perf_counter() - start), step_losses


class _StepClock(HookBase):
    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start = 0.0
        self.end = 0.0
        self.losses: list[torch.Tensor] = []

    def after_step(self) -> None:
        self.losses.append(torch.stack(list(self.trainer.last_losses.values())).sum())
        # after_step of step `warmup` marks the start; the run's final step the end.
        _synchronize(self.trainer.device)
        now = time.perf_counter()
        if self.trainer.iter == self.warmup:
            self.start = now
        self.end = now


def run_maskops(
    root: Path, args: argparse.Namespace, *, use_amp: bool, tuning: DeviceTuning = DeviceTuning()
) -> tuple[float, list[float]]:
    """``run_training`` for ``warmup + steps`` steps: images/s after the warm-up, and every
    step's total loss."""
    spec = make_spec(root, args, use_amp=use_amp)
    clock = _StepClock(args.warmup)
    out = Path(tempfile.mkdtemp(prefix="bench_train_"))
    try:
        run_training(spec, out, extra_hooks=[clock], eval_fn=lambda model, step: {}, tuning=tuning)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    images_per_s = args.steps * args.batch / (clock.end - clock.start)
    return images_per_s, [float(loss) for loss in clock.losses]


def measure_arm(arm: str, root: Path, args: argparse.Namespace) -> tuple[float, list[float]]:
    """Train ``arm`` on ``prepare_shards(root)``' data in this process: images/s after the
    warm-up, and every step's total loss."""
    loop, precision, *variant = arm.split("-")
    use_amp = precision == "amp"
    if loop == "torchvision":
        return run_torchvision(root, args, use_amp=use_amp)
    tuning = VARIANTS[variant[0]] if variant else DeviceTuning()
    return run_maskops(root, args, use_amp=use_amp, tuning=tuning)


def child(args: argparse.Namespace) -> None:
    """One arm in this process: prints ``RESULT {images_per_s, peak memory}``."""
    torch.set_num_threads(args.threads)
    images_per_s, losses = measure_arm(args.arm, Path(args.root), args)
    figures: dict[str, Any] = {"images_per_s": images_per_s, "mean_loss": statistics.fmean(losses)}
    rss = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    figures["peak_rss_mb"] = round(rss / 1024)
    if args.device == "cuda":
        figures["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
    print("RESULT " + json.dumps(figures), flush=True)


def run_arm(arm: str, root: Path, args: argparse.Namespace, recorded: dict[str, Any]) -> float:
    """One arm in a fresh process; its images/s (into ``recorded``: peak memory, the max
    over rounds, and the mean loss of each round). A variant arm that fails gives NaN and
    its error under ``recorded[arm]["failed"]`` (and is not run again); any other ends the
    run."""
    if "failed" in recorded.get(arm, {}):
        return math.nan
    command = [sys.executable, __file__, "--arm", arm, "--root", str(root)]
    for key in (
        "nlayers",
        "image_size",
        "batch",
        "steps",
        "warmup",
        "workers",
        "threads",
        "device",
        "coco_shaped",
        "heads",
    ):
        value = getattr(args, key)
        if isinstance(value, bool):  # a flag
            command += [f"--{key.replace('_', '-')}"] if value else []
            continue
        command += [
            f"--{key.replace('_', '-')}",
            *map(str, value if isinstance(value, list) else [value]),
        ]
    # run_training takes a GPU wherever one is visible: a CPU run hides them from both loops.
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {})}
    process = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [x for x in process.stdout.splitlines() if x.startswith("RESULT ")]
    if process.returncode != 0 or not lines:
        print(process.stderr[-3000:], file=sys.stderr)
        if arm.count("-") < 2:
            raise SystemExit(f"arm {arm} failed (exit {process.returncode})")
        error = process.stderr.strip().splitlines()[-1:] or ["no output"]
        recorded.setdefault(arm, {})["failed"] = f"exit {process.returncode}: {error[0][:300]}"
        print(f"{arm:17s} failed, not run again: {recorded[arm]['failed']}", flush=True)
        return math.nan
    figures: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    for key in ("peak_rss_mb", "peak_cuda_mb"):
        if key in figures:
            recorded.setdefault(arm, {})[key] = max(figures[key], recorded.get(arm, {}).get(key, 0))
    recorded.setdefault(arm, {}).setdefault("mean_loss_by_round", []).append(
        round(figures["mean_loss"], 4)
    )
    print(f"{arm:17s} {figures['images_per_s']:.4f} img/s", flush=True)
    return float(figures["images_per_s"])


def compare(spreads: dict[str, Spread], precision: str) -> dict[str, Any]:
    """maskops / torchvision at one precision: ratio of medians and per-round range."""
    ours, base = spreads[f"maskops-{precision}"], spreads[f"torchvision-{precision}"]
    per_round = [a / b for a, b in zip(ours.values, base.values, strict=True)]
    return {
        "ratio": round(ours.median / base.median, 3),
        "per_round_min": round(min(per_round), 3),
        "per_round_max": round(max(per_round), 3),
        "per_round_median": round(statistics.median(per_round), 3),
    }


def tuning_ratios(spreads: dict[str, Spread]) -> dict[str, Any]:
    """Each variant arm's images/s over its precision's default maskops arm (ratio of
    medians, and per round): above 1, flipping that switch is faster than the default."""
    ratios: dict[str, Any] = {}
    for arm, spread in spreads.items():
        _loop, precision, *variant = arm.split("-")
        base = spreads.get(f"maskops-{precision}")
        if not variant or base is None or math.isnan(spread.median):
            continue
        per_round = [a / b for a, b in zip(spread.values, base.values, strict=True)]
        ratios[arm] = {
            "ratio": round(spread.median / base.median, 3),
            "per_round_min": round(min(per_round), 3),
            "per_round_max": round(max(per_round), 3),
        }
    return ratios


def arm_summary(spread: Spread, recorded: dict[str, Any]) -> dict[str, Any]:
    """An arm's images/s over the rounds and what it recorded; a failed arm's error alone."""
    if "failed" in recorded:
        return {"failed": recorded["failed"]}
    return {**spread.summary("images_per_s"), **recorded}


@contextmanager
def data_folder(named: Path | None) -> Iterator[Path]:
    """The folder the run's data is prepared in: ``named`` (``--data``), kept for the next
    run (several batch sizes draw their data once), or a temporary one."""
    if named is not None:
        named.mkdir(parents=True, exist_ok=True)
        yield named
        return
    with tempfile.TemporaryDirectory(prefix="bench_train_data_") as tmp:
        yield Path(tmp)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlayers", type=int, default=18)
    parser.add_argument("--image-size", type=int, nargs=2, default=[512, 512])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per arm")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=3, help="each arm once per round")
    parser.add_argument("--workers", type=int, default=1, help="loader processes (both loops)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--heads", default="tao", choices=sorted(HEADS), help="RoI/RPN heads")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS + VARIANT_ARMS)
    parser.add_argument("--require-idle", action="store_true", help="refuse to run when loaded")
    parser.add_argument(
        "--coco-shaped",
        action="store_true",
        help="5-30 instances per image, resized, flipped (bench/synthetic.py)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        help="prepare the data in this folder and keep it; data prepared there before for "
        "at least as many images is used as it is (default: a temporary folder)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here")
    return args


def main() -> None:
    args = parse_args()
    if args.arm:
        child(args)
        return
    conditions = start_run(require_idle=args.require_idle)
    amp = AmpSettings.for_device(torch.device(args.device), enabled=True)
    arms = [a for a in args.arms if amp.enabled or "-amp" not in a]
    if amp.declined and len(arms) < len(args.arms):
        print(f"AMP arms skipped: {amp.declined}")
    recorded: dict[str, Any] = {}
    with data_folder(args.data) as root:
        prepared = prepare_shards(
            root,
            train_images=train_images(args),
            image_size=tuple(args.image_size),
            coco_shaped=coco_shaped(args),
        )
        measures = [lambda arm=arm: run_arm(arm, root, args, recorded) for arm in arms]
        spreads = dict(zip(arms, alternate(measures, args.rounds, warmup=0), strict=True))
    figures: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("arm", "root", "out")},
        "images": prepared["images"],
        "amp": {"dtype": str(amp.dtype), "scaler": amp.needs_scaler} if amp.enabled else None,
        "amp_skipped": amp.declined or None,
        "arms": {a: arm_summary(spreads[a], recorded.get(a, {})) for a in arms},
        "failed_arms": {a: recorded[a]["failed"] for a in arms if "failed" in recorded.get(a, {})},
        "maskops_vs_torchvision": {
            p: compare(spreads, p)
            for p in ("fp32", "amp")
            if {f"maskops-{p}", f"torchvision-{p}"} <= set(arms)
        },
        "tuning_vs_default": tuning_ratios(spreads),
    }
    for precision, row in figures["maskops_vs_torchvision"].items():
        print(
            f"{precision}: maskops {row['ratio']}x the torchvision loop "
            f"(per round {row['per_round_min']}-{row['per_round_max']})"
        )
    default = (
        RESULTS if args.device == "cpu" else RESULTS.with_name(f"bench_train_{args.device}.json")
    )
    write_results(args.out or default, figures, conditions)


if __name__ == "__main__":
    main()
