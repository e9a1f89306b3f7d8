"""Where a training step waits for the GPU: each synchronising CUDA call, by source line.

torch's sync debug mode warns at every call that blocks the host on the device (a read of
a value, a copy without ``non_blocking``, ``nonzero`` and the like). This runs a few
training steps of the test suite's tiny model (tests/conftest.py's ``tiny_spec``: resnet10
at 128x128 on the demo shapes, AMP) with the mode on and records, for each warning, the
innermost frame of maskops or torchvision that made the call::

    python bench/sync_sites.py --device cuda --batch 2 --out FILE

It prints the calls per step and the sites with their counts over the counted steps (the
first and last steps are left out: the first allocates, the last checks the loss). On a
CPU nothing synchronises and every count is 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
import warnings
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from machine import start_run, write_results
from synthetic import TINY_HEADS

SOURCES = ("maskops", "torchvision")
SYNC_WARNING = "called a synchronizing CUDA operation"
"""What torch's sync debug mode says (c10/cuda/CUDAFunctions.cpp)."""


def tiny_spec(root: Path, batch: int) -> Any:
    """tests/conftest.py's ``tiny_spec`` at ``batch`` images per step on demo data in
    ``root``."""
    from maskops.data.convert import convert_dataset
    from maskops.data.demo import generate_demo_dataset
    from maskops.spec.models import ExperimentSpec

    demo = generate_demo_dataset(
        root / "demo", num_images=32, image_size=(128, 128), seed=0, val_fraction=0.25
    )
    shards = root / "shards"
    convert_dataset(demo.train_images, demo.train_json, shards, workers=1)
    return ExperimentSpec.model_validate(
        {
            "seed": 7,
            "train_batch_size": batch,
            "data_config": {
                "image_size": (128, 128),
                "training_file_pattern": f"{shards}/train*",
                "num_classes": 4,
                "n_workers": 0,
            },
            "maskrcnn_config": {"nlayers": 10, **TINY_HEADS},
        }
    )


def call_site(stack: list[traceback.FrameSummary]) -> str:
    """``file:line function`` of the innermost frame in maskops or torchvision."""
    for frame in reversed(stack):
        parts = Path(frame.filename).parts
        for source in SOURCES:
            if source in parts:
                relative = "/".join(parts[len(parts) - 1 - parts[::-1].index(source) :])
                return f"{relative}:{frame.lineno} {frame.name}"
    return "elsewhere"


def sync_sites(spec: Any, device_name: str, steps: int) -> dict[str, Any]:
    """Per step, the synchronising calls; over the counted steps, their sites."""
    import torch

    from maskops.data.pipeline import build_train_loader
    from maskops.training.optim import build_optimizer
    from maskops.training.seeding import seed_everything
    from maskops.training.train import build_training_model
    from maskops.training.trainer import AmpSettings, HookBase, Trainer

    device = torch.device(device_name)
    seed_everything(spec.seed)
    model = build_training_model(spec, num_classes=spec.data_config.num_classes).to(device)
    sites: list[list[str]] = []

    class PerStep(HookBase):
        def before_step(self) -> None:
            sites.append([])

    def record(message: Warning | str, *_: Any, **__: Any) -> None:
        if sites and SYNC_WARNING in str(message):
            sites[-1].append(call_site(traceback.extract_stack()[:-1]))

    trainer = Trainer(
        model=model,
        optimizer=build_optimizer(model, lr=0.004, momentum=0.9, l2_weight_decay=1e-4),
        data=iter(build_train_loader(spec)),
        schedule=lambda step: 0.004,
        max_steps=steps,
        device=device,
        amp=AmpSettings.for_device(device, enabled=True),
        finite_check_period=steps,
    )
    trainer.register_hooks([PerStep()])
    shown = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.train()
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = shown
    counted = sites[1:-1]
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device_name,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "batch": spec.train_batch_size,
        "per_step": [len(step) for step in sites],
        "sites": dict(Counter(site for step in counted for site in step).most_common()),
        "counted_steps": len(counted),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    conditions = start_run()
    with tempfile.TemporaryDirectory() as root:
        figures = sync_sites(tiny_spec(Path(root), args.batch), args.device, args.steps)
    print(json.dumps(figures, indent=1))
    if args.out:
        write_results(args.out, figures, conditions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
