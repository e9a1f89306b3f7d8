"""The training benchmarks' data and spec: demo shapes, converted, and a throughput spec.

bench_train.py and bench_scaling.py time the same model on the same data; this module is
the one place both take them from. Two shapes of data:

- the demo's (default): 1-5 shapes per image, drawn at the training size (no resize);
- COCO-shaped (``coco_shaped``): 5-30 instances per image of radii 2-20% of the shorter
  side (COCO averages 7 instances, many small), drawn at 480x640 (COCO's typical frame)
  so that the loader resizes every image to the training size, with random horizontal
  flips on (``throughput_spec(augment=True)``), as a TAO COCO run trains.

Two sizes of RoI and RPN heads (``HEADS``): TAO's (default), and CI's tiny ones, which
keep every path of a step at a fraction of its cost on a CPU.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from maskops.atomic import atomic_write
from maskops.data.convert import convert_dataset
from maskops.data.convert_options import DEFAULT_NUM_SHARDS
from maskops.data.demo import ShapeLayout, generate_demo_dataset
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

VAL_FRACTION = 0.2
COCO_LAYOUT = ShapeLayout(min_shapes=5, max_shapes=30, min_radius=0.02, max_radius=0.2)
COCO_IMAGE_SIZE = (480, 640)

TINY_HEADS: dict[str, Any] = {
    "min_level": 3,
    "max_level": 5,
    "anchor_scale": 2.0,
    "rpn_batch_size_per_im": 64,
    "batch_size_per_im": 32,
    "fast_rcnn_mlp_head_dim": 128,
    "train_rpn_pre_nms_topn": 200,
    "train_rpn_post_nms_topn": 100,
    "test_rpn_pre_nms_topn": 100,
    "test_rpn_post_nms_topn": 50,
    "test_detections_per_image": 20,
    "gt_mask_size": 28,
    "mrcnn_resolution": 16,
}
"""CI's heads, which tests/conftest.py's ``tiny_spec`` and the API tests' spec take too:
FPN levels 3..5 for the demo shapes, small heads and sampling sizes (TAO's make a 128x128
resnet10 step about four times slower on a CPU: 512 RoIs an image through the 4-conv mask
head)."""
HEADS: dict[str, dict[str, Any]] = {"tao": {}, "tiny": TINY_HEADS}
"""``maskrcnn_config`` overrides by name: TAO's defaults, or :data:`TINY_HEADS`."""


PREPARED = "prepared.json"
"""What ``prepare_shards`` drew into its folder, written once the shards are complete."""


def images_for(train_images: int) -> int:
    """Demo images to generate so that the training split holds ``train_images``."""
    return math.ceil(train_images / (1 - VAL_FRACTION)) + 1


def prepare_shards(
    root: Path,
    *,
    train_images: int,
    image_size: tuple[int, int],
    num_shards: int = DEFAULT_NUM_SHARDS,
    coco_shaped: bool = False,
) -> dict[str, Any]:
    """Demo shapes at ``image_size`` (COCO-shaped: :data:`COCO_LAYOUT` at
    :data:`COCO_IMAGE_SIZE`) under ``root/demo``, converted to ``root/shards``, drawn and
    converted by a process per core (the same files for any count: 261 COCO-shaped
    images, a batch of 16's run, would take minutes on one). Data this call already
    prepared there for at least ``train_images`` is kept, so runs at several batch sizes
    draw it once. Returns ``root/prepared.json``: ``images`` (drawn), ``train_images``
    (the training split's) and ``as`` (the arguments that shape them)."""
    drawn_size = COCO_IMAGE_SIZE if coco_shaped else image_size
    wanted = {"drawn_size": list(drawn_size), "coco_shaped": coco_shaped, "shards": num_shards}
    record = root / PREPARED
    if record.exists():
        prepared = json.loads(record.read_text())
        if prepared["train_images"] >= train_images and prepared["as"] == wanted:
            return dict(prepared)
        record.unlink()
    for folder in ("demo", "shards"):  # another draw's, or one cut short
        shutil.rmtree(root / folder, ignore_errors=True)
    cores, images = len(os.sched_getaffinity(0)), images_for(train_images)
    demo = generate_demo_dataset(
        root / "demo",
        num_images=images,
        image_size=drawn_size,
        seed=0,
        val_fraction=VAL_FRACTION,
        layout=COCO_LAYOUT if coco_shaped else ShapeLayout(),
        workers=cores,
    )
    shards = root / "shards"
    convert_dataset(
        demo.train_images, demo.train_json, shards, num_shards=num_shards, workers=cores
    )
    convert_dataset(demo.val_images, demo.val_json, shards, workers=cores)
    held = len(json.loads(demo.train_json.read_text())["images"])
    prepared = {"images": images, "train_images": held, "as": wanted}
    atomic_write(record, json.dumps(prepared))
    return prepared


def throughput_spec(
    root: Path,
    *,
    steps: int,
    batch: int,
    image_size: tuple[int, int],
    nlayers: int,
    workers: int,
    use_amp: bool = False,
    augment: bool = False,
    heads: str = "tao",
) -> ExperimentSpec:
    """A fixed-rate run (no warm-up; random flips only with ``augment``) over
    ``prepare_shards``' data, with the :data:`HEADS` named ``heads``."""
    return ExperimentSpec(
        seed=0,
        use_amp=use_amp,
        total_steps=steps,
        train_batch_size=batch,
        init_learning_rate=0.002,
        warmup_steps=0,
        data_config=DataConfig(
            image_size=image_size,
            training_file_pattern=f"{root}/shards/train*",
            validation_file_pattern=f"{root}/shards/val*",
            num_classes=4,
            n_workers=workers,
            augment_input_data=augment,
        ),
        maskrcnn_config=MaskRCNNConfig(nlayers=nlayers, **HEADS[heads]),
    )
