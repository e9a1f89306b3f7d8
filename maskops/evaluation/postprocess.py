"""From model outputs to COCO results: mask pasting, RLE encoding, category ids.

The model predicts, per detection, an ``[M, M]`` mask probability map for its box. The
usual way to turn that into a COCO segmentation (torchvision's references,
maskrcnn-benchmark) pastes every map into a full-size image and then RLE-encodes the whole
image: ``O(N * H * W)`` work and memory per image. Here each map is resized only to its
box, thresholded, and the RLE of the full image is derived from the box crop alone, so the
work is ``O(box area)``.

The pasting reproduces torchvision's ``paste_masks_in_image`` exactly: the map is padded
by one pixel on each side, the box is expanded by the same factor ``(M + 2) / M`` and
truncated to integers, the padded map is resized bilinearly (``align_corners=False``) to
``(y2 - y1 + 1, x2 - x1 + 1)`` pixels, and a pixel is foreground when its probability is
``> threshold``. The same float32 operations run in the same order, so the RLEs are
identical to ``paste_masks_in_image`` followed by ``pycocotools.mask.encode`` (the tests
check this on random inputs and require equality, not just a high IoU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from maskops.data.labels import LabelMap
from maskops.evaluation.threads import run_single_threaded
from maskops.serving.triton_models.maskops_serving_ops import (
    RLE,
    compress_counts,
    crop_to_counts,
    has_area,
    runs_to_counts,
)

__all__ = ["RLE", "compress_counts", "crop_to_counts", "detections_to_coco", "paste_masks_rle"]

_PADDING = 1
"""Pixels of zero padding around each mask map, as torchvision's ``expand_masks``."""


def expand_boxes(boxes: torch.Tensor, scale: float) -> torch.Tensor:
    """Scale boxes about their centres (torchvision's ``expand_boxes``, same float ops).

    Args:
        boxes: ``[N, 4]`` float32 xyxy.
        scale: the factor applied to width and height.

    Returns:
        ``[N, 4]`` float32 xyxy.
    """
    w_half = (boxes[:, 2] - boxes[:, 0]) * 0.5
    h_half = (boxes[:, 3] - boxes[:, 1]) * 0.5
    x_c = (boxes[:, 2] + boxes[:, 0]) * 0.5
    y_c = (boxes[:, 3] + boxes[:, 1]) * 0.5
    w_half *= scale
    h_half *= scale
    return torch.stack([x_c - w_half, y_c - h_half, x_c + w_half, y_c + h_half], dim=1)


def paste_masks_rle(
    boxes: torch.Tensor | np.ndarray,
    mask_probs: torch.Tensor | np.ndarray,
    image_hw: tuple[int, int],
    *,
    threshold: float = 0.5,
) -> list[RLE]:
    """Paste per-box mask probabilities into an image and encode them as COCO RLEs.

    Only each box's region is computed; the result is the same as torchvision's
    ``paste_masks_in_image(mask_probs, boxes, image_hw) > threshold`` encoded with
    ``pycocotools.mask.encode``.

    Args:
        boxes: ``[N, 4]`` xyxy boxes in the pixel frame of the target image (original
            image pixels for COCO results); converted to float32.
        mask_probs: ``[N, M, M]`` or ``[N, 1, M, M]`` mask probabilities (0..1) covering
            each box, as Mask R-CNN's mask head outputs them.
        image_hw: ``(height, width)`` of the target image.
        threshold: a pixel is foreground when its probability is ``> threshold``.

    Returns:
        ``N`` RLE dicts ``{"size": [height, width], "counts": str}``.
    """
    probs = torch.as_tensor(mask_probs).detach().to("cpu", torch.float32)
    if probs.ndim == 4:
        probs = probs[:, 0]
    box_t = torch.as_tensor(boxes).detach().to("cpu", torch.float32).reshape(-1, 4)
    if probs.ndim != 3 or probs.shape[0] != box_t.shape[0] or probs.shape[1] != probs.shape[2]:
        raise ValueError(
            f"expected mask_probs [N, M, M] for {box_t.shape[0]} boxes, "
            f"got {tuple(torch.as_tensor(mask_probs).shape)}"
        )
    if box_t.shape[0] == 0:
        return []
    # Many small torch ops: run them where torch uses one intra-op thread (see threads).
    return run_single_threaded(
        _paste_and_encode, box_t, probs, (int(image_hw[0]), int(image_hw[1])), threshold
    )


def _paste_and_encode(
    boxes: torch.Tensor, probs: torch.Tensor, image_hw: tuple[int, int], threshold: float
) -> list[RLE]:
    """:func:`paste_masks_rle` on float32 ``[N, 4]`` boxes and ``[N, M, M]`` maps."""
    height, width = image_hw
    size = probs.shape[-1]
    padded = F.pad(probs, (_PADDING,) * 4)
    int_boxes = expand_boxes(boxes, (size + 2 * _PADDING) / size).to(torch.int64).tolist()
    all_counts: list[np.ndarray] = []
    for index, (bx0, by0, bx1, by1) in enumerate(int_boxes):
        x0, x1 = max(bx0, 0), min(bx1 + 1, width)
        y0, y1 = max(by0, 0), min(by1 + 1, height)
        if x1 <= x0 or y1 <= y0:
            all_counts.append(runs_to_counts(np.zeros(0, np.int64), height * width))
            continue
        box_h, box_w = max(by1 - by0 + 1, 1), max(bx1 - bx0 + 1, 1)
        resized = F.interpolate(
            padded[index][None, None], size=(box_h, box_w), mode="bilinear", align_corners=False
        )[0, 0].numpy()
        crop = resized[y0 - by0 : y1 - by0, x0 - bx0 : x1 - bx0] > threshold
        all_counts.append(crop_to_counts(crop, y0, x0, (height, width)))
    return compress_counts(all_counts, (height, width))


def boxes_to_original(
    boxes: torch.Tensor, *, scale: float, orig_hw: tuple[int, int]
) -> torch.Tensor:
    """Map boxes from the model's resized frame to original pixels, clipped to the image.

    Args:
        boxes: ``[N, 4]`` xyxy in the resized (model input) frame.
        scale: the ``resize_and_pad`` factor (original -> resized).
        orig_hw: ``(height, width)`` of the original image.

    Returns:
        ``[N, 4]`` float32 xyxy in original pixels. Clipping matters because the model
        input is padded: a box may reach into the padding, outside the original image.
    """
    out = boxes.detach().to("cpu", torch.float32) / scale
    out[:, 0::2] = out[:, 0::2].clamp(0, orig_hw[1])
    out[:, 1::2] = out[:, 1::2].clamp(0, orig_hw[0])
    return out


def detections_to_coco(
    output: Mapping[str, torch.Tensor],
    *,
    image_id: int,
    scale: float,
    orig_hw: tuple[int, int],
    label_map: LabelMap,
    score_threshold: float = 0.0,
    include_mask: bool = True,
    mask_threshold: float = 0.5,
) -> list[dict[str, Any]]:
    """Turn one image's model output into COCO results.

    Args:
        output: the model's eval output for one image: ``boxes`` ``[N, 4]`` xyxy in the
            resized input frame, ``labels`` ``[N]`` contiguous training labels (1..K),
            ``scores`` ``[N]``, and optionally ``masks`` ``[N, 1, M, M]`` (or
            ``[N, M, M]``) probabilities over each box.
        image_id: the original dataset image id.
        scale: the ``resize_and_pad`` factor of this image.
        orig_hw: ``(height, width)`` of the original image.
        label_map: maps training labels back to dataset category ids.
        score_threshold: detections scoring below this are dropped, and so are those
            whose box, clipped to the image, has no area (the serving ops' ``has_area``).
        include_mask: add ``segmentation`` when the output has ``masks``.
        mask_threshold: mask probability above which a pixel is foreground.

    Returns:
        One dict per kept detection: ``image_id``, ``category_id`` (original id),
        ``bbox`` ``[x, y, w, h]`` in original pixels (clipped to the image), ``score``,
        and ``segmentation`` (compressed RLE ``{"size": [h, w], "counts": str}``) when
        masks are present and ``include_mask`` is true.
    """
    scores = output["scores"].detach().to("cpu", torch.float32)
    boxes = boxes_to_original(output["boxes"].detach().cpu(), scale=scale, orig_hw=orig_hw)
    keep = (scores >= score_threshold) & torch.from_numpy(has_area(boxes.numpy()))
    scores, boxes = scores[keep], boxes[keep]
    labels = output["labels"].detach().to("cpu")[keep].tolist()
    rles: list[RLE] | None = None
    if include_mask and "masks" in output:
        rles = paste_masks_rle(
            boxes,
            output["masks"].detach().cpu()[keep],
            orig_hw,
            threshold=mask_threshold,
        )
    xywh = boxes.clone()
    xywh[:, 2:] -= xywh[:, :2]
    results: list[dict[str, Any]] = []
    for i, (label, box, score) in enumerate(
        zip(labels, xywh.tolist(), scores.tolist(), strict=True)
    ):
        result: dict[str, Any] = {
            "image_id": int(image_id),
            "category_id": label_map.category_id_of(int(label)),
            "bbox": box,
            "score": score,
        }
        if rles is not None:
            result["segmentation"] = rles[i]
        results.append(result)
    return results
