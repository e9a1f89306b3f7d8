"""Benchmark: the shard pipeline against torchvision's reference COCO loading, and conversion.

Measured in one run on the same synthetic data (demo shapes at ``--size``, COCO-like):

1. Training-sample throughput (decode + flip + targets + resize/pad to ``--image-size``,
   samples/s through a DataLoader with ``--workers`` processes): maskops' shard pipeline
   against the way torchvision's detection reference scripts load COCO (pycocotools index
   of the JSON, PIL decode of each file, polygon rasterisation per sample with
   ``frPyObjects``/``decode``, random flip, then GeneralizedRCNNTransform's float resize of
   image and masks). Goal: ratio >= 2.
2. Conversion images/s and peak RSS of ``dataset_convert`` on ``--images`` images, and on a
   fifth of them: equal peaks show that memory does not grow with the dataset.
3. Drawing images/s of ``--draw-images`` COCO-shaped demo images (bench/synthetic.py's:
   5-30 shapes at 480x640, what the GPU check's batch sweep draws) by ``--workers``
   processes against one (the same files for any count).

``--unique`` distinct images are drawn and hard-linked under further names to reach
``--images`` (drawing 5,000 would take longer than converting them). Figures go to
``bench/results/bench_data_pipeline.json``.

    .venv/bin/python bench/bench_data_pipeline.py                 # ~ a few minutes
    .venv/bin/python bench/bench_data_pipeline.py --images 5000   # COCO val2017's size
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from machine import start_run, write_results
from PIL import Image
from pycocotools import mask as coco_mask
from pycocotools.coco import COCO
from synthetic import COCO_IMAGE_SIZE, COCO_LAYOUT, VAL_FRACTION
from timing import alternate
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.functional import pil_to_tensor

from maskops.data.demo import generate_demo_dataset
from maskops.data.pipeline import DecodeOptions, ShardDataset, TrainStream

RESULTS = Path(__file__).resolve().parent / "results" / "bench_data_pipeline.json"


def build_dataset(root: Path, *, images: int, unique: int, size: tuple[int, int]) -> Path:
    """Draw ``unique`` demo images and list them under ``images`` names in one COCO file."""
    demo = generate_demo_dataset(
        root / "demo", num_images=unique + 1, image_size=size, seed=0, val_fraction=0.01
    )
    source = json.loads(demo.train_json.read_text())
    image_dir = root / "images"
    image_dir.mkdir()
    anns_by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in source["annotations"]:
        anns_by_image.setdefault(ann["image_id"], []).append(ann)
    document: dict[str, Any] = {"images": [], "annotations": [], "categories": source["categories"]}
    for index in range(images):
        original = source["images"][index % len(source["images"])]
        name = f"{index:07d}.jpg"
        os.link(demo.train_images / original["file_name"], image_dir / name)
        document["images"].append({**original, "id": index, "file_name": name})
        for ann in anns_by_image.get(original["id"], []):
            ann_id = len(document["annotations"])
            document["annotations"].append({**ann, "id": ann_id, "image_id": index})
    path = root / "train.json"
    path.write_text(json.dumps(document))
    return path


_CONVERT = """
import json, resource, sys, time
from maskops.data.convert import convert_dataset
start = time.perf_counter()
result = convert_dataset(sys.argv[1], sys.argv[2], sys.argv[3], workers=int(sys.argv[4]))
seconds = time.perf_counter() - start
print(json.dumps({
    "images": result.num_images,
    "seconds": seconds,
    "images_per_s": result.num_images / seconds,
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the (torch-laden) parent.
    "peak_rss_mb": int(next(line.split()[1] for line in open("/proc/self/status")
                            if line.startswith("VmHWM:"))) / 1024,
    "peak_rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    "shards": len(result.shards),
    "warnings": sum(result.warning_counts.values()),
}))
"""


def measure_drawing(root: Path, *, images: int, workers: int, rounds: int) -> dict[str, Any]:
    """Images/s of drawing ``images`` COCO-shaped demo images in one process and in
    ``workers``, alternated in ``rounds``."""

    def draw(count: int) -> float:
        out = root / f"drawn_by_{count}"
        started = time.perf_counter()
        generate_demo_dataset(
            out,
            num_images=images,
            image_size=COCO_IMAGE_SIZE,
            seed=0,
            val_fraction=VAL_FRACTION,
            layout=COCO_LAYOUT,
            workers=count,
        )
        seconds = time.perf_counter() - started
        shutil.rmtree(out)
        return images / seconds

    one, many = alternate([lambda: draw(1), lambda: draw(workers)], rounds, warmup=0)
    return {
        "images": images,
        "one_process": one.summary("images_per_s", digits=3),
        "workers": many.summary("images_per_s", digits=3),
        "ratio": round(many.median / one.median, 3),
    }


def measure_conversion(image_dir: Path, ann_file: Path, out: Path, workers: int) -> dict[str, Any]:
    """Convert in a fresh process, so its peak RSS is the conversion's alone."""
    done = subprocess.run(
        [sys.executable, "-c", _CONVERT, str(image_dir), str(ann_file), str(out), str(workers)],
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def subset(ann_file: Path, fraction: float, out: Path) -> Path:
    document = json.loads(ann_file.read_text())
    keep = document["images"][: max(1, int(len(document["images"]) * fraction))]
    ids = {image["id"] for image in keep}
    document["images"] = keep
    document["annotations"] = [a for a in document["annotations"] if a["image_id"] in ids]
    out.write_text(json.dumps(document))
    return out


class ReferenceCocoDataset(Dataset[tuple[torch.Tensor, dict[str, Any]]]):
    """torchvision references/detection: CocoDetection + ConvertCocoPolysToMask + flip,
    then GeneralizedRCNNTransform's resize (float bilinear; masks float nearest) and pad."""

    def __init__(
        self, image_dir: Path, ann_file: Path, image_size: tuple[int, int], seed: int
    ) -> None:
        self.image_dir = image_dir
        self.coco = COCO(str(ann_file))
        self.ids = sorted(self.coco.imgs)
        self.image_size = image_size
        self.seed = seed

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        image_id = self.ids[index]
        info = self.coco.loadImgs(image_id)[0]
        image = Image.open(self.image_dir / info["file_name"]).convert("RGB")
        anns = [
            a
            for a in self.coco.loadAnns(self.coco.getAnnIds(imgIds=image_id))
            if a.get("iscrowd", 0) == 0
        ]
        width, height = image.size
        boxes = torch.as_tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        boxes[:, 0::2].clamp_(min=0, max=width)
        boxes[:, 1::2].clamp_(min=0, max=height)
        labels = torch.tensor([a["category_id"] for a in anns], dtype=torch.int64)
        masks = _polygons_to_masks([a["segmentation"] for a in anns], height, width)
        keep = (boxes[:, 3] > boxes[:, 1]) & (boxes[:, 2] > boxes[:, 0])
        boxes, labels, masks = boxes[keep], labels[keep], masks[keep]
        tensor = pil_to_tensor(image)
        if random.Random(f"{self.seed}-{index}").random() < 0.5:
            tensor, masks = tensor.flip(-1), masks.flip(-1)
            boxes = torch.stack(
                [width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], 1
            )
        tensor = tensor.float() / 255.0
        scale = min(self.image_size[0] / height, self.image_size[1] / width)
        resized = F.interpolate(
            tensor[None],
            scale_factor=scale,
            mode="bilinear",
            recompute_scale_factor=True,
            align_corners=False,
        )[0]
        new_h, new_w = resized.shape[-2:]
        masks = F.interpolate(masks[:, None].float(), size=(new_h, new_w))[:, 0].byte()
        padded = resized.new_zeros((3, *self.image_size))
        padded[:, :new_h, :new_w] = resized
        padded_masks = masks.new_zeros((len(masks), *self.image_size))
        padded_masks[:, :new_h, :new_w] = masks
        target = {
            "boxes": boxes * scale,
            "labels": labels,
            "masks": padded_masks,
            "image_id": image_id,
        }
        return padded, target


def _polygons_to_masks(segmentations: list[Any], height: int, width: int) -> torch.Tensor:
    """references/detection/coco_utils.py: convert_coco_poly_to_mask."""
    masks = []
    for polygons in segmentations:
        rles = coco_mask.frPyObjects(polygons, height, width)
        mask = coco_mask.decode(rles)
        if len(mask.shape) < 3:
            mask = mask[..., None]
        masks.append(torch.as_tensor(mask, dtype=torch.uint8).any(dim=2))
    if not masks:
        return torch.zeros((0, height, width), dtype=torch.uint8)
    return torch.stack(masks, dim=0).to(torch.uint8)


def _list_collate(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch, strict=True))


def _identity(batch: Any) -> Any:
    return batch


def samples_per_second(loader: DataLoader[Any], batches: int, batch_size: int) -> float:
    iterator = iter(loader)
    for _ in range(2 * max(1, loader.num_workers)):  # worker start-up is not throughput
        next(iterator)
    start = time.perf_counter()
    for _ in islice(iterator, batches):
        pass
    return batches * batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1000, help="images to convert")
    parser.add_argument("--unique", type=int, default=100, help="distinct images drawn")
    parser.add_argument("--size", type=int, nargs=2, default=(480, 640), metavar=("H", "W"))
    parser.add_argument("--image-size", type=int, nargs=2, default=(512, 512), metavar=("H", "W"))
    parser.add_argument("--samples", type=int, default=300, help="samples timed per pipeline")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader / converter processes")
    parser.add_argument("--rounds", type=int, default=3, help="alternated timing rounds")
    parser.add_argument("--draw-images", type=int, default=8, help="COCO-shaped images drawn")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--require-idle", action="store_true", help="refuse to run when loaded")
    args = parser.parse_args()
    conditions = start_run(require_idle=args.require_idle)
    size, image_size = tuple(args.size), tuple(args.image_size)

    root = Path(tempfile.mkdtemp(prefix="bench_data_"))
    try:
        t0 = time.perf_counter()
        ann_file = build_dataset(root, images=args.images, unique=args.unique, size=size)
        print(
            f"dataset: {args.images} images of {size[1]}x{size[0]} "
            f"({args.unique} distinct) in {time.perf_counter() - t0:.1f}s"
        )

        small_file = subset(ann_file, 0.2, root / "small.json")
        small = measure_conversion(root / "images", small_file, root / "small_out", args.workers)
        full = measure_conversion(root / "images", ann_file, root / "shards", args.workers)
        for name, figures in (("1/5", small), ("all", full)):
            print(
                f"conversion ({name}): {figures['images']} images, "
                f"{figures['images_per_s']:.1f} images/s, peak RSS {figures['peak_rss_mb']:.0f} MB"
                f" (+ workers {figures['peak_rss_worker_mb']:.0f} MB each at most)"
            )

        batches = max(1, args.samples // args.batch_size)
        dataset = ShardDataset(root / "shards", DecodeOptions(image_size=image_size))
        stream = TrainStream(dataset, batch_size=args.batch_size, seed=0)
        ours_loader: DataLoader[Any] = DataLoader(
            stream, batch_size=None, num_workers=args.workers, collate_fn=_identity
        )
        reference = ReferenceCocoDataset(root / "images", ann_file, image_size, seed=0)
        reference_loader: DataLoader[Any] = DataLoader(
            reference,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            collate_fn=_list_collate,
            generator=torch.Generator().manual_seed(0),
        )
        baseline, ours = alternate(
            [
                lambda: samples_per_second(reference_loader, batches, args.batch_size),
                lambda: samples_per_second(ours_loader, batches, args.batch_size),
            ],
            args.rounds,
            warmup=0,
        )
        ratio = ours.median / baseline.median
        print(
            f"pipeline: maskops {ours.median:.1f} samples/s vs torchvision reference "
            f"{baseline.median:.1f} samples/s (medians of {args.rounds} rounds) -> ratio "
            f"{ratio:.2f}x (goal >= 2x)"
        )
        drawing = measure_drawing(
            root, images=args.draw_images, workers=args.workers, rounds=args.rounds
        )
        print(
            f"drawing: {drawing['workers']['median_images_per_s']} images/s by {args.workers} "
            f"processes vs {drawing['one_process']['median_images_per_s']} by one -> ratio "
            f"{drawing['ratio']:.2f}x"
        )
        results = {
            "config": {
                "images": args.images,
                "unique": args.unique,
                "size": size,
                "image_size": image_size,
                "samples": batches * args.batch_size,
                "batch_size": args.batch_size,
                "workers": args.workers,
                "draw_images": args.draw_images,
            },
            "conversion": {"all": full, "fifth": small},
            "drawing": drawing,
            "pipeline": {
                "maskops": ours.summary("samples_per_s", digits=2),
                "reference": baseline.summary("samples_per_s", digits=2),
                "ratio": round(ratio, 3),
            },
        }
        write_results(args.out, results, conditions)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
