"""Benchmark: COCO evaluation of Mask R-CNN outputs, maskops vs torchvision's references.

Model time excluded: both paths start from the same synthetic model outputs (per image
``--detections`` boxes, labels, scores and 28x28 mask probabilities, in the model frame)
for ``--images`` images of 832x1344 with COCO-like ground truth (polygons, 20
non-contiguous category ids), and end with the 24 COCO metrics.

- reference: torchvision's detection references (``coco_eval.py``): each image's masks
  pasted into full-size images with ``paste_masks_in_image``, thresholded at 0.5,
  ``pycocotools.mask.encode`` per detection, then pycocotools' COCOeval (bbox and segm).
- maskops: ``COCOEvaluator`` (box-region pasting and crop RLE in two threads, then
  faster-coco-eval).

Prints the end-to-end ratio (goal >= 5x), checks that the metrics are identical (1e-6)
and the RLEs equal, and reports the mask paste+encode time per image of each path alone.
Figures go to ``bench/results/bench_eval.json``.

    .venv/bin/python bench/bench_eval.py            # 20 images, a couple of minutes
    .venv/bin/python bench/bench_eval.py --full     # the issue's 500 images
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pycocotools.mask as mask_util
import torch
from machine import describe_machine
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torchvision.models.detection.roi_heads import paste_masks_in_image

from maskops.data.labels import LabelMap
from maskops.evaluation import COCOEvaluator, metric_names, paste_masks_rle
from maskops.evaluation.postprocess import boxes_to_original

RESULTS = Path(__file__).resolve().parent / "results" / "bench_eval.json"
HEIGHT, WIDTH = 832, 1344
CATEGORY_IDS = [1, 2, 3, 5, 7, 9, 11, 15, 18, 22, 27, 33, 40, 44, 52, 61, 67, 75, 84, 90]
BATCH = 8


def _polygon(rng: np.random.Generator, box: np.ndarray) -> list[float]:
    """A wobbly ellipse inscribed in ``box`` (xyxy), as a COCO polygon."""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    rx, ry = (box[2] - box[0]) / 2, (box[3] - box[1]) / 2
    angles = np.linspace(0, 2 * np.pi, 16, endpoint=False)
    radius = rng.uniform(0.8, 1.0, angles.size)
    xs = np.clip(cx + rx * radius * np.cos(angles), 0, WIDTH)
    ys = np.clip(cy + ry * radius * np.sin(angles), 0, HEIGHT)
    return np.stack([xs, ys], 1).ravel().round(2).tolist()


def _random_box(rng: np.random.Generator) -> np.ndarray:
    w, h = np.exp(rng.uniform(np.log(8), np.log(600), 2))
    x0, y0 = rng.uniform(0, WIDTH - w), rng.uniform(0, HEIGHT - h)
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
    num_images: int, detections: int, seed: int = 0
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], dict[str, torch.Tensor]]]]:
    """COCO ground truth and per-image (target, model output) pairs."""
    rng = np.random.default_rng(seed)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    pairs: list[tuple[dict[str, Any], dict[str, torch.Tensor]]] = []
    for index in range(num_images):
        image_id = 100_000 + 13 * index
        images.append({"id": image_id, "height": HEIGHT, "width": WIDTH, "file_name": f"{index}"})
        gt_boxes, gt_cats = [], []
        for _ in range(int(rng.integers(5, 26))):
            box = _random_box(rng)
            poly = _polygon(rng, box)
            rle = mask_util.frPyObjects([poly], HEIGHT, WIDTH)[0]
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
                box, category = _random_box(rng), int(rng.choice(CATEGORY_IDS))
            box = np.clip(box, 0, [WIDTH, HEIGHT, WIDTH, HEIGHT])
            box[2:] = np.maximum(box[2:], box[:2] + 1)
            boxes.append(box)
            labels.append(CATEGORY_IDS.index(category) + 1)
        output = {
            "boxes": torch.tensor(np.array(boxes), dtype=torch.float32),
            "labels": torch.tensor(labels),
            "scores": torch.from_numpy(rng.uniform(0.05, 1.0, detections)).float(),
            "masks": _mask_probs(rng, detections),
        }
        target = {"image_id": image_id, "scale": 1.0, "orig_size": (HEIGHT, WIDTH)}
        pairs.append((target, output))
    categories = [{"id": c, "name": f"c{c}"} for c in CATEGORY_IDS]
    return {"images": images, "annotations": annotations, "categories": categories}, pairs


def reference_results(
    pairs: list[tuple[dict[str, Any], dict[str, torch.Tensor]]], label_map: LabelMap
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """torchvision references: full-image paste, threshold, encode; returns bbox and segm
    results (segm without boxes, as ``prepare_for_coco_segmentation``) and the paste+encode
    seconds."""
    bbox_results, segm_results, paste_seconds = [], [], 0.0
    for target, output in pairs:
        h, w = target["orig_size"]
        boxes = boxes_to_original(output["boxes"], scale=target["scale"], orig_hw=(h, w))
        started = time.perf_counter()
        masks = paste_masks_in_image(output["masks"], boxes, (h, w)) > 0.5
        rles = [
            mask_util.encode(np.array(m[0, :, :, np.newaxis], dtype=np.uint8, order="F"))[0]
            for m in masks
        ]
        paste_seconds += time.perf_counter() - started
        xywh = boxes.clone()
        xywh[:, 2:] -= xywh[:, :2]
        ids = [label_map.category_id_of(int(v)) for v in output["labels"]]
        for k, (box, score) in enumerate(
            zip(xywh.tolist(), output["scores"].tolist(), strict=True)
        ):
            common = {"image_id": target["image_id"], "category_id": ids[k], "score": score}
            bbox_results.append({**common, "bbox": box})
            rle = rles[k]
            rle["counts"] = rle["counts"].decode("utf-8")
            segm_results.append({**common, "segmentation": rle})
    return bbox_results, segm_results, paste_seconds


def reference_metrics(
    gt_path: Path, bbox: list[dict[str, Any]], segm: list[dict[str, Any]], image_ids: list[int]
) -> dict[str, float]:
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO(str(gt_path))
    metrics: dict[str, float] = {}
    for iou_type, results in (("bbox", bbox), ("segm", segm)):
        with contextlib.redirect_stdout(io.StringIO()):
            evaluator = COCOeval(coco_gt, coco_gt.loadRes(copy.deepcopy(results)), iou_type)
            evaluator.params.imgIds = image_ids
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
        names = metric_names([iou_type])
        metrics.update({n: float(v) for n, v in zip(names, evaluator.stats[:12], strict=True)})
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--full", action="store_true", help="500 images (the issue's size)")
    parser.add_argument("--detections", type=int, default=100)
    parser.add_argument(
        "--reference-threads",
        type=int,
        default=0,
        help="torch intra-op threads for the reference path (0 = torch's default); on a "
        "busy machine the default's thread contention slows the full-image paste a lot",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    num_images = 500 if args.full else args.images

    print(f"{num_images} images of {HEIGHT}x{WIDTH}, {args.detections} detections each")
    gt, pairs = make_data(num_images, args.detections)
    label_map = LabelMap.from_coco_categories(gt["categories"])
    image_ids = [t["image_id"] for t, _ in pairs]
    with tempfile.TemporaryDirectory() as tmp:
        gt_path = Path(tmp) / "gt.json"
        gt_path.write_text(json.dumps(gt))

        default_threads = torch.get_num_threads()
        if args.reference_threads:
            torch.set_num_threads(args.reference_threads)
        started = time.perf_counter()
        bbox, segm, ref_paste = reference_results(pairs, label_map)
        ref_metrics = reference_metrics(gt_path, bbox, segm, image_ids)
        ref_seconds = time.perf_counter() - started
        torch.set_num_threads(default_threads)
        print(f"reference (torchvision + pycocotools): {ref_seconds:.1f} s")

        started = time.perf_counter()
        evaluator = COCOEvaluator(gt_path, label_map)
        for i in range(0, len(pairs), BATCH):
            chunk = pairs[i : i + BATCH]
            evaluator.process([t for t, _ in chunk], [o for _, o in chunk])
        ours = evaluator.evaluate()
        our_seconds = time.perf_counter() - started
        print(f"maskops (COCOEvaluator):               {our_seconds:.1f} s")

    # Paste + encode alone, one image at a time on one thread, same boxes for both.
    started = time.perf_counter()
    our_rles = []
    for target, output in pairs:
        boxes = boxes_to_original(output["boxes"], scale=1.0, orig_hw=target["orig_size"])
        our_rles.extend(paste_masks_rle(boxes, output["masks"], target["orig_size"]))
    our_paste = time.perf_counter() - started
    identical_rles = sum(
        o["counts"] == r["segmentation"]["counts"] for o, r in zip(our_rles, segm, strict=True)
    )
    max_diff = max(abs(ours[k] - ref_metrics[k]) for k in ref_metrics)
    figures = {
        "images": num_images,
        "detections_per_image": args.detections,
        "image_hw": [HEIGHT, WIDTH],
        "reference_torch_threads": args.reference_threads or default_threads,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "machine": describe_machine(),
        "reference_seconds": round(ref_seconds, 3),
        "maskops_seconds": round(our_seconds, 3),
        "speedup": round(ref_seconds / our_seconds, 2),
        "reference_paste_encode_ms_per_image": round(1000 * ref_paste / num_images, 2),
        "maskops_paste_encode_ms_per_image": round(1000 * our_paste / num_images, 2),
        "paste_encode_speedup": round(ref_paste / our_paste, 2),
        "identical_rles": f"{identical_rles}/{len(segm)}",
        "metrics_max_abs_diff": max_diff,
        "metrics_identical": max_diff <= 1e-6,
        "metrics": ours,
    }
    print(f"end-to-end speedup: {figures['speedup']}x (goal >= 5x)")
    print(
        f"paste+encode per image: reference {figures['reference_paste_encode_ms_per_image']} ms,"
        f" maskops {figures['maskops_paste_encode_ms_per_image']} ms "
        f"({figures['paste_encode_speedup']}x)"
    )
    print(
        f"identical RLEs: {figures['identical_rles']}; metrics max |diff| {max_diff:.2e} "
        f"({'identical' if figures['metrics_identical'] else 'DIFFERENT'}); "
        f"AP {ours['AP']:.4f}, mask_AP {ours['mask_AP']:.4f}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"figures written to {args.out}")


if __name__ == "__main__":
    main()
