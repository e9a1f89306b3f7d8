"""Benchmark: COCO evaluation of Mask R-CNN outputs, maskops vs torchvision's references.

Model time excluded: every arm starts from the same synthetic model outputs (per image
``--detections`` boxes, labels, scores and 28x28 mask probabilities, in the model frame)
for ``--images`` images of ``--height`` x ``--width`` with COCO-like ground truth
(polygons, 20 non-contiguous category ids), and ends with the 24 COCO metrics. Arms:

- reference: torchvision's detection references (``coco_eval.py``): each image's masks
  pasted into full-size images with ``paste_masks_in_image``, thresholded at 0.5,
  ``pycocotools.mask.encode`` per detection, then pycocotools' COCOeval (bbox and segm).
- hybrid: the same paste + encode, then faster-coco-eval (what maskops evaluates with):
  the ratio hybrid / maskops is what the box-region pasting and crop RLE alone are worth.
- maskops: ``COCOEvaluator`` (box-region pasting and crop RLE in two threads, then
  faster-coco-eval), end to end.

Paste + encode and COCOeval are timed separately, each arm once per round in turn
(bench/timing.py), at torch's default threads and at one thread. Checks that the metrics
are identical (1e-6) and the RLEs equal; records wall time and peak RSS. Figures go to
``bench/results/bench_eval.json``.

    .venv/bin/python bench/bench_eval.py              # 20 images, a few minutes
    # COCO val2017's size: ~45 min on 2 cores, most of it the reference's paste + encode
    .venv/bin/python bench/bench_eval.py --images 5000 --rounds 1 --threads 2 \\
        --out bench/results/bench_eval_5000.json
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pycocotools.mask as mask_util
import torch
from machine import start_run, write_results
from timing import Spread, alternated_seconds
from torchvision.models.detection.roi_heads import paste_masks_in_image

from maskops.data.labels import LabelMap
from maskops.evaluation import COCOEvaluator, paste_masks_rle
from maskops.evaluation.coco import CocoMetrics
from maskops.evaluation.postprocess import boxes_to_original

RESULTS = Path(__file__).resolve().parent / "results" / "bench_eval.json"
CATEGORY_IDS = [1, 2, 3, 5, 7, 9, 11, 15, 18, 22, 27, 33, 40, 44, 52, 61, 67, 75, 84, 90]
BATCH = 8
Pairs = list[tuple[dict[str, Any], dict[str, torch.Tensor]]]


def _polygon(rng: np.random.Generator, box: np.ndarray, hw: tuple[int, int]) -> list[float]:
    """A wobbly ellipse inscribed in ``box`` (xyxy), as a COCO polygon."""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    rx, ry = (box[2] - box[0]) / 2, (box[3] - box[1]) / 2
    angles = np.linspace(0, 2 * np.pi, 16, endpoint=False)
    radius = rng.uniform(0.8, 1.0, angles.size)
    xs = np.clip(cx + rx * radius * np.cos(angles), 0, hw[1])
    ys = np.clip(cy + ry * radius * np.sin(angles), 0, hw[0])
    return np.stack([xs, ys], 1).ravel().round(2).tolist()


def _random_box(rng: np.random.Generator, hw: tuple[int, int]) -> np.ndarray:
    longest = max(9.0, min(600.0, 0.7 * min(hw)))
    w, h = np.exp(rng.uniform(np.log(8), np.log(longest), 2))
    x0, y0 = rng.uniform(0, hw[1] - w), rng.uniform(0, hw[0] - h)
    return np.array([x0, y0, x0 + w, y0 + h])


def _mask_probs(rng: np.random.Generator, n: int, size: int = 28) -> torch.Tensor:
    """Soft ellipses with noise: what a trained mask head's sigmoid outputs look like."""
    grid = (np.arange(size) + 0.5) / size * 2 - 1
    yy, xx = np.meshgrid(grid, grid, indexing="ij")
    scale = rng.uniform(0.7, 1.1, (n, 2, 1, 1))
    radius = np.sqrt((xx / scale[:, 0]) ** 2 + (yy / scale[:, 1]) ** 2)
    logits = 6 * (1 - radius) + rng.normal(0, 1.0, (n, size, size))
    return torch.from_numpy(1 / (1 + np.exp(-logits))).float()[:, None]


def make_data(
    num_images: int, detections: int, hw: tuple[int, int], seed: int = 0
) -> tuple[dict[str, Any], Pairs]:
    """COCO ground truth and per-image (target, model output) pairs."""
    rng = np.random.default_rng(seed)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    pairs: Pairs = []
    height, width = hw
    for index in range(num_images):
        image_id = 100_000 + 13 * index
        images.append({"id": image_id, "height": height, "width": width, "file_name": f"{index}"})
        gt_boxes, gt_cats = [], []
        for _ in range(int(rng.integers(5, 26))):
            poly = _polygon(rng, _random_box(rng, hw), hw)
            rle = mask_util.frPyObjects([poly], height, width)[0]
            x, y, w, h = mask_util.toBbox(rle).tolist()
            category = int(rng.choice(CATEGORY_IDS))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category,
                    "segmentation": [poly],
                    "area": float(mask_util.area(rle)),
                    "bbox": [x, y, w, h],
                    "iscrowd": 0,
                }
            )
            gt_boxes.append([x, y, x + w, y + h])
            gt_cats.append(category)
        boxes, labels = [], []
        for _ in range(detections):
            if gt_boxes and rng.random() < 0.5:
                k = int(rng.integers(len(gt_boxes)))
                box = (
                    np.array(gt_boxes[k])
                    + rng.normal(0, 0.05, 4)
                    * (gt_boxes[k][2] - gt_boxes[k][0] + gt_boxes[k][3] - gt_boxes[k][1])
                    / 2
                )
                category = gt_cats[k] if rng.random() < 0.8 else int(rng.choice(CATEGORY_IDS))
            else:
                box, category = _random_box(rng, hw), int(rng.choice(CATEGORY_IDS))
            box = np.clip(box, 0, [width, height, width, height])
            box[2:] = np.maximum(box[2:], box[:2] + 1)
            boxes.append(box)
            labels.append(CATEGORY_IDS.index(category) + 1)
        output = {
            "boxes": torch.tensor(np.array(boxes), dtype=torch.float32),
            "labels": torch.tensor(labels),
            "scores": torch.from_numpy(rng.uniform(0.05, 1.0, detections)).float(),
            "masks": _mask_probs(rng, detections),
        }
        target = {"image_id": image_id, "scale": 1.0, "orig_size": hw}
        pairs.append((target, output))
    categories = [{"id": c, "name": f"c{c}"} for c in CATEGORY_IDS]
    return {"images": images, "annotations": annotations, "categories": categories}, pairs


def _original_boxes(target: dict[str, Any], output: dict[str, torch.Tensor]) -> torch.Tensor:
    return boxes_to_original(output["boxes"], scale=target["scale"], orig_hw=target["orig_size"])


def reference_results(pairs: Pairs, label_map: LabelMap) -> list[dict[str, Any]]:
    """torchvision references: full-image paste, threshold at 0.5, pycocotools encode."""
    results = []
    for target, output in pairs:
        boxes = _original_boxes(target, output)
        masks = paste_masks_in_image(output["masks"], boxes, target["orig_size"]) > 0.5
        rles = [
            mask_util.encode(np.array(m[0, :, :, np.newaxis], dtype=np.uint8, order="F"))[0]
            for m in masks
        ]
        xywh = boxes.clone()
        xywh[:, 2:] -= xywh[:, :2]
        ids = [label_map.category_id_of(int(v)) for v in output["labels"]]
        scores = output["scores"].tolist()
        for k, (box, rle) in enumerate(zip(xywh.tolist(), rles, strict=True)):
            rle["counts"] = rle["counts"].decode("utf-8")
            results.append(
                {
                    "image_id": target["image_id"],
                    "category_id": ids[k],
                    "score": scores[k],
                    "bbox": box,
                    "segmentation": rle,
                }
            )
    return results


def maskops_rles(pairs: Pairs) -> list[dict[str, Any]]:
    """maskops' paste + encode alone, one image at a time."""
    return [
        rle
        for target, output in pairs
        for rle in paste_masks_rle(
            _original_boxes(target, output), output["masks"], target["orig_size"]
        )
    ]


def maskops_end_to_end(gt_path: Path, pairs: Pairs, label_map: LabelMap) -> dict[str, float]:
    evaluator = COCOEvaluator(gt_path, label_map)
    for i in range(0, len(pairs), BATCH):
        chunk = pairs[i : i + BATCH]
        evaluator.process([t for t, _ in chunk], [o for _, o in chunk])
    return evaluator.evaluate()


def _at_threads(threads: int, fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        torch.set_num_threads(threads)
        return fn()

    return run


def _keep(sink: list[Any], fn: Callable[[], Any]) -> Callable[[], None]:
    """``fn``, its last answer kept in ``sink[0]`` (the timed calls' outputs are checked)."""

    def run() -> None:
        sink[:] = [fn()]

    return run


def _sum(a: Spread, b: Spread) -> Spread:
    """Per round: two parts timed in the same round make that round's whole."""
    return Spread(tuple(x + y for x, y in zip(a.values, b.values, strict=True)))


def bench_threads(
    threads: int, gt: dict[str, Any], gt_path: Path, pairs: Pairs, rounds: int
) -> dict[str, Any]:
    """Every arm at ``threads`` torch threads; the outputs of the last round compared."""
    label_map = LabelMap.from_coco_categories(gt["categories"])
    ref: list[Any] = []
    ours_rles: list[Any] = []
    ref_metrics: list[Any] = []
    ours: list[Any] = []
    hybrid_metrics: list[Any] = []
    arms = {
        "reference_paste_encode": _keep(ref, lambda: reference_results(pairs, label_map)),
        "maskops_paste_encode": _keep(ours_rles, lambda: maskops_rles(pairs)),
        "pycocotools_cocoeval": _keep(
            ref_metrics, lambda: CocoMetrics(gt, backend="pycocotools").compute(ref[0])
        ),
        "faster_coco_eval": _keep(
            hybrid_metrics, lambda: CocoMetrics(gt, backend="faster").compute(ref[0])
        ),
        "maskops_end_to_end": _keep(ours, lambda: maskops_end_to_end(gt_path, pairs, label_map)),
    }
    timed = alternated_seconds([_at_threads(threads, f) for f in arms.values()], rounds, 0)
    spreads = dict(zip(arms, timed, strict=True))
    reference = _sum(spreads["reference_paste_encode"], spreads["pycocotools_cocoeval"])
    hybrid = _sum(spreads["reference_paste_encode"], spreads["faster_coco_eval"])
    maskops = spreads["maskops_end_to_end"]
    identical = sum(
        o["counts"] == r["segmentation"]["counts"]
        for o, r in zip(ours_rles[0], ref[0], strict=True)
    )
    # maskops' and the hybrid's metrics, each against pycocotools' on the reference RLEs.
    max_diff = max(
        abs(other[0][k] - ref_metrics[0][k])
        for other in (ours, hybrid_metrics)
        for k in ref_metrics[0]
    )
    n = len(pairs)
    row: dict[str, Any] = {name: spread.summary("s", digits=3) for name, spread in spreads.items()}
    row |= {
        "reference_end_to_end": reference.summary("s", digits=3),
        "hybrid_end_to_end": hybrid.summary("s", digits=3),
        "speedup_vs_reference": round(reference.median / maskops.median, 2),
        "speedup_vs_hybrid": round(hybrid.median / maskops.median, 2),
        "paste_encode_speedup": round(
            spreads["reference_paste_encode"].median / spreads["maskops_paste_encode"].median, 2
        ),
        "reference_paste_encode_ms_per_image": round(
            1000 * spreads["reference_paste_encode"].median / n, 2
        ),
        "maskops_paste_encode_ms_per_image": round(
            1000 * spreads["maskops_paste_encode"].median / n, 2
        ),
        "identical_rles": f"{identical}/{len(ref[0])}",
        "metrics_max_abs_diff": max_diff,
        "metrics_identical": max_diff <= 1e-6 and identical == len(ref[0]),
    }
    print(
        f"{threads} thread(s): end to end {row['speedup_vs_reference']}x the reference, "
        f"{row['speedup_vs_hybrid']}x the hybrid (torchvision paste + faster-coco-eval); "
        f"paste+encode {row['reference_paste_encode_ms_per_image']} vs "
        f"{row['maskops_paste_encode_ms_per_image']} ms/image "
        f"({row['paste_encode_speedup']}x); RLEs {row['identical_rles']}, metrics "
        f"max |diff| {max_diff:.1e}",
        flush=True,
    )
    row["metrics"] = ours[0]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--detections", type=int, default=100)
    parser.add_argument("--height", type=int, default=832)
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--rounds", type=int, default=3, help="each arm once per round")
    parser.add_argument(
        "--threads", type=int, nargs="+", help="torch thread counts (default: torch's and 1)"
    )
    parser.add_argument("--require-idle", action="store_true", help="refuse to run when loaded")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    conditions = start_run(require_idle=args.require_idle)
    started = time.perf_counter()
    hw = (args.height, args.width)
    print(f"{args.images} images of {hw[0]}x{hw[1]}, {args.detections} detections each")
    gt, pairs = make_data(args.images, args.detections, hw)
    default_threads = torch.get_num_threads()
    by_threads = {}
    with tempfile.TemporaryDirectory() as tmp:
        gt_path = Path(tmp) / "gt.json"
        gt_path.write_text(json.dumps(gt))
        for threads in sorted(set(args.threads or (default_threads, 1)), reverse=True):
            by_threads[str(threads)] = bench_threads(threads, gt, gt_path, pairs, args.rounds)
    torch.set_num_threads(default_threads)
    figures = {
        "images": args.images,
        "detections_per_image": args.detections,
        "image_hw": list(hw),
        "default_torch_threads": default_threads,
        "by_threads": by_threads,
        "metrics_identical": all(row["metrics_identical"] for row in by_threads.values()),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    write_results(args.out, figures, conditions)


if __name__ == "__main__":
    main()
