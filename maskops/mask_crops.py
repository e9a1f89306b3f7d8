"""Ground-truth instance masks cropped to their boxes: the part the mask head reads.

A full-frame training mask is ``image_size`` bytes per instance (1.1 MB at 832x1344), almost
all of it zeros outside the instance's box, and every byte is built by a loader worker,
passed to the main process, pinned and copied to the device. The mask head reads a gt mask
only through one RoIAlign over the gt box (``aligned=True``:
:func:`maskops.modeling.roi_heads.project_masks_via_gt_crops`), whose bilinear samples lie
in ``[x1 - 0.5, x2 - 0.5]`` and touch the pixels ``floor(x1 - 0.5) .. floor(x2 - 0.5) + 1``.
A crop of the columns ``floor(x1) - 1 .. ceil(x2)`` (one pixel more on each side, against
float rounding of the sample positions), and likewise of the rows, holds every pixel read.

Compact masks are ``masks``: uint8 ``[N, h + 1, w + 1]``, instance ``n``'s crop in the top
left corner of its slice and zeros after it (``h``, ``w``: the largest crop's height and
width), and ``mask_origins``: float32 ``[N, 2]``, the frame's ``(x, y)`` of each crop's top
left pixel. Moving the gt box by ``-origin`` gives the same RoIAlign samples of the same
values, except at the frame's right and bottom edges: there the full frame ends, and
RoIAlign repeats the edge pixel for samples up to one pixel beyond it, while a crop is
followed by its zero padding. A crop that ends at the frame's edge therefore repeats its
last column (row) once in the padding. This holds for gt boxes inside the frame, and up to
half a pixel beyond it, as the data pipeline's are (the converter clips boxes to the image).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

MASK_ORIGINS = "mask_origins"
"""The target key of compact masks' origins; a target without it holds full-frame masks."""

MaskRegion = tuple[int, int, Tensor]
"""Where an instance's mask pixels lie in the frame: top row, left column and their values
(uint8 ``[h, w]``); the frame is zero elsewhere."""


def crop_windows(boxes: Tensor, frame: tuple[int, int]) -> Tensor:
    """The crop of each gt box that holds every pixel the mask head reads (module doc).

    Args:
        boxes: ``[N, 4]`` float xyxy gt boxes, frame pixels.
        frame: the frame's ``(H, W)``.

    Returns:
        int64 ``[N, 4]`` ``(x0, y0, x1, y1)``: columns ``x0 .. x1 - 1`` and rows
        ``y0 .. y1 - 1``, within the frame (empty for a box entirely outside it).
    """
    limits = torch.tensor([frame[1], frame[0]], dtype=torch.int64)
    low = (boxes[:, :2].floor().to(torch.int64) - 1).clamp(min=0)
    low = torch.minimum(low, limits)
    high = torch.minimum(boxes[:, 2:].ceil().to(torch.int64) + 1, limits)
    return torch.cat([low, torch.maximum(high, low)], dim=1)


def crop_regions(
    regions: Iterable[MaskRegion], boxes: Tensor, frame: tuple[int, int]
) -> tuple[Tensor, Tensor]:
    """Compact masks (module doc) of the instances whose pixels ``regions`` give, one per
    box of ``boxes`` (``[N, 4]`` float xyxy) in a frame of ``frame`` ``(H, W)``.

    Returns:
        uint8 ``[N, h + 1, w + 1]`` crops and float32 ``[N, 2]`` ``(x, y)`` origins.
    """
    windows = crop_windows(boxes, frame)
    sizes = windows[:, 2:] - windows[:, :2]
    width, height = (int(v) for v in sizes.amax(dim=0)) if len(windows) else (0, 0)
    crops = torch.zeros((len(windows), height + 1, width + 1), dtype=torch.uint8)
    for n, (top, left, values) in enumerate(regions):
        x0, y0, x1, y1 = (int(v) for v in windows[n])
        rows = slice(max(top, y0), min(top + values.shape[0], y1))
        cols = slice(max(left, x0), min(left + values.shape[1], x1))
        if rows.start < rows.stop and cols.start < cols.stop:
            crops[n, rows.start - y0 : rows.stop - y0, cols.start - x0 : cols.stop - x0] = values[
                rows.start - top : rows.stop - top, cols.start - left : cols.stop - left
            ]
        _repeat_frame_edges(crops[n], (x1 - x0, y1 - y0), (x1 == frame[1], y1 == frame[0]))
    return crops, windows[:, :2].to(torch.float32)


def _repeat_frame_edges(crop: Tensor, size: tuple[int, int], at_edge: tuple[bool, bool]) -> None:
    """Repeat a crop's last column (row) once where it ends at the frame's right (bottom)
    edge: RoIAlign reads the full frame's edge pixel there (module doc)."""
    width, height = size
    if width == 0 or height == 0:
        return
    if at_edge[0]:
        crop[:height, width] = crop[:height, width - 1]
    if at_edge[1]:
        crop[height, : width + 1] = crop[height - 1, : width + 1]


def crop_masks(masks: Tensor, boxes: Tensor) -> tuple[Tensor, Tensor]:
    """Full-frame masks (uint8 ``[N, H, W]``) as compact masks (:func:`crop_regions`)."""
    regions = [(0, 0, mask) for mask in masks]
    return crop_regions(regions, boxes, (int(masks.shape[-2]), int(masks.shape[-1])))
