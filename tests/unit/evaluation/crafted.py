"""Crafted COCO ground truth and detections for evaluation tests (no model involved)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pycocotools.mask as mask_util

CATEGORY_IDS = (3, 17, 90)
"""Deliberately non-contiguous, as COCO's are."""


def _rle(mask: np.ndarray) -> dict[str, Any]:
    rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": rle["size"], "counts": rle["counts"].decode("utf-8")}


def _box_mask(h: int, w: int, box: tuple[int, int, int, int]) -> np.ndarray:
    x0, y0, x1, y1 = box
    mask = np.zeros((h, w), dtype=np.uint8)
    mask[y0:y1, x0:x1] = 1
    return mask


def make_ground_truth(
    rng: np.random.Generator, *, num_images: int = 6, with_crowd: bool = True
) -> dict[str, Any]:
    """Images of varying size with polygon instances of three categories, some crowd RLEs."""
    images, annotations = [], []
    ann_id = 1
    for index in range(num_images):
        image_id = 1000 + 7 * index  # original ids are neither 0-based nor contiguous
        h, w = int(rng.integers(80, 160)), int(rng.integers(80, 200))
        images.append({"id": image_id, "height": h, "width": w, "file_name": f"{image_id}.jpg"})
        for _ in range(int(rng.integers(1, 5))):
            bw, bh = int(rng.integers(4, w // 2)), int(rng.integers(4, h // 2))
            x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            # A triangle-topped pentagon: a polygon whose mask differs from its box.
            poly = [
                x0,
                y0 + bh / 3,
                x0 + bw / 2,
                y0,
                x0 + bw,
                y0 + bh / 3,
                x0 + bw,
                y0 + bh,
                x0,
                y0 + bh,
            ]
            rle = mask_util.frPyObjects([poly], h, w)
            area = float(mask_util.area(rle)[0])
            annotations.append(
                {
                    "id": ann_id,
                    "image_id": image_id,
                    "category_id": int(rng.choice(CATEGORY_IDS)),
                    "bbox": [float(x0), float(y0), float(bw), float(bh)],
                    "segmentation": [poly],
                    "area": area,
                    "iscrowd": 0,
                }
            )
            ann_id += 1
        if with_crowd and index % 2 == 0:
            box = (0, 0, w // 3, h // 3)
            mask = _box_mask(h, w, box)
            counts = mask_util.encode(np.asfortranarray(mask))
            # Crowd regions come as uncompressed RLE in COCO files.
            unc = _uncompressed_counts(mask)
            annotations.append(
                {
                    "id": ann_id,
                    "image_id": image_id,
                    "category_id": CATEGORY_IDS[0],
                    "bbox": [0.0, 0.0, float(w // 3), float(h // 3)],
                    "segmentation": {"size": [h, w], "counts": unc},
                    "area": float(mask_util.area(counts)),
                    "iscrowd": 1,
                }
            )
            ann_id += 1
    categories = [{"id": c, "name": f"cat{c}"} for c in CATEGORY_IDS]
    return {"images": images, "annotations": annotations, "categories": categories}


def _uncompressed_counts(mask: np.ndarray) -> list[int]:
    flat = mask.flatten(order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0] == 1:
        counts = [0, *counts]
    return [int(c) for c in counts]


def gt_mask(gt: dict[str, Any], ann: dict[str, Any]) -> np.ndarray:
    image = next(i for i in gt["images"] if i["id"] == ann["image_id"])
    h, w = image["height"], image["width"]
    seg = ann["segmentation"]
    rles = (
        mask_util.frPyObjects(seg, h, w)
        if isinstance(seg, list)
        else [mask_util.frPyObjects(seg, h, w)]
    )
    return mask_util.decode(mask_util.merge(rles) if len(rles) > 1 else rles[0]).astype(bool)


def perfect_results(gt: dict[str, Any]) -> list[dict[str, Any]]:
    """One detection per non-crowd GT instance, exactly its box and mask."""
    results = []
    for ann in gt["annotations"]:
        if ann["iscrowd"]:
            continue
        results.append(
            {
                "image_id": ann["image_id"],
                "category_id": ann["category_id"],
                "bbox": list(ann["bbox"]),
                "score": 0.9,
                "segmentation": _rle(gt_mask(gt, ann)),
            }
        )
    return results


def noisy_results(
    gt: dict[str, Any], rng: np.random.Generator, *, skip_images: int = 1
) -> list[dict[str, Any]]:
    """Jittered detections of the GT plus random false positives; the first ``skip_images``
    images get none."""
    sizes = {i["id"]: (i["height"], i["width"]) for i in gt["images"]}
    skipped = {i["id"] for i in gt["images"][:skip_images]}
    results = []
    for ann in gt["annotations"]:
        if ann["image_id"] in skipped:
            continue
        h, w = sizes[ann["image_id"]]
        x, y, bw, bh = ann["bbox"]
        dx, dy = rng.normal(0, 0.15 * bw), rng.normal(0, 0.15 * bh)
        x0, y0 = int(np.clip(x + dx, 0, w - 2)), int(np.clip(y + dy, 0, h - 2))
        x1, y1 = int(np.clip(x0 + bw, x0 + 1, w)), int(np.clip(y0 + bh, y0 + 1, h))
        results.append(
            {
                "image_id": ann["image_id"],
                "category_id": ann["category_id"]
                if rng.random() > 0.1
                else int(rng.choice(gt["categories"])["id"]),
                "bbox": [float(x0), float(y0), float(x1 - x0), float(y1 - y0)],
                "score": float(rng.random()),
                "segmentation": _rle(_box_mask(h, w, (x0, y0, x1, y1))),
            }
        )
    for image in gt["images"][skip_images:]:
        h, w = image["height"], image["width"]
        for _ in range(int(rng.integers(0, 4))):
            x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
            x1, y1 = int(rng.integers(x0 + 1, w)), int(rng.integers(y0 + 1, h))
            results.append(
                {
                    "image_id": image["id"],
                    "category_id": int(rng.choice(gt["categories"])["id"]),
                    "bbox": [float(x0), float(y0), float(x1 - x0), float(y1 - y0)],
                    "score": float(rng.random()),
                    "segmentation": _rle(_box_mask(h, w, (x0, y0, x1, y1))),
                }
            )
    return results
