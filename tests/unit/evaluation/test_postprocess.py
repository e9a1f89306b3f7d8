"""Mask pasting and COCO conversion against torchvision + pycocotools."""

from __future__ import annotations

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch
from torchvision.models.detection.roi_heads import paste_masks_in_image

from maskops.data.labels import LabelMap
from maskops.evaluation.postprocess import crop_to_counts, detections_to_coco, paste_masks_rle


def _reference_rles(boxes: torch.Tensor, probs: torch.Tensor, hw: tuple[int, int]) -> list[str]:
    """torchvision's references: paste into the full image, threshold, encode."""
    pasted = paste_masks_in_image(probs[:, None], boxes, hw)[:, 0] > 0.5
    return [
        mask_util.encode(np.asfortranarray(m.numpy().astype(np.uint8)))["counts"].decode()
        for m in pasted
    ]


def _random_boxes(gen: torch.Generator, n: int, hw: tuple[int, int]) -> torch.Tensor:
    """Boxes as a detector emits them: inside the image (clipped), some tiny, some huge."""
    h, w = hw
    xy = torch.rand(n, 2, generator=gen) * torch.tensor([w, h]) * 1.1 - 5
    wh = torch.rand(n, 2, generator=gen) ** 2 * torch.tensor([w, h])
    boxes = torch.cat([xy, xy + wh], dim=1)
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
    return boxes


@pytest.mark.parametrize(
    ("seed", "hw", "resolution"),
    [(0, (120, 170), 28), (1, (333, 250), 28), (2, (64, 480), 14), (3, (257, 129), 28)],
)
def test_rles_identical_to_torchvision_paste_and_pycocotools_encode(
    seed: int, hw: tuple[int, int], resolution: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = 150
    boxes = _random_boxes(gen, n, hw)
    # Edge cases a detector produces: the whole image, a box on each border, a sliver.
    h, w = hw
    boxes[:4] = torch.tensor(
        [[0, 0, w, h], [0, 10, 7, 30], [w - 3, h - 9, w, h], [5.5, 6.2, 5.9, 40.0]]
    )
    probs = torch.rand(n, resolution, resolution, generator=gen)
    probs[:2] = 1.0  # full boxes: runs continue from one image column into the next
    probs[5] = 0.0  # empty mask
    probs[6] = 0.5  # exactly at the threshold: background (> 0.5 is foreground)

    ours = paste_masks_rle(boxes, probs, hw)

    assert [r["counts"] for r in ours] == _reference_rles(boxes, probs, hw)
    assert all(r["size"] == [h, w] and isinstance(r["counts"], str) for r in ours)


def test_accepts_four_dim_masks_numpy_and_no_detections() -> None:
    gen = torch.Generator().manual_seed(4)
    boxes = _random_boxes(gen, 5, (90, 90))
    probs = torch.rand(5, 1, 28, 28, generator=gen)
    from_numpy = paste_masks_rle(boxes.numpy(), probs.numpy(), (90, 90))
    assert from_numpy == paste_masks_rle(boxes, probs, (90, 90))
    assert paste_masks_rle(torch.zeros(0, 4), torch.zeros(0, 28, 28), (90, 90)) == []
    with pytest.raises(ValueError, match=r"mask_probs"):
        paste_masks_rle(boxes, probs[:3], (90, 90))


def test_crop_counts_match_full_image_encode() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        h, w = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        top, left = int(rng.integers(0, h)), int(rng.integers(0, w))
        ch, cw = int(rng.integers(1, h - top + 1)), int(rng.integers(1, w - left + 1))
        # Sparse, dense and all-on crops; a crop spanning the full height merges columns.
        crop = rng.random((ch, cw)) < rng.choice([0.1, 0.6, 1.0])
        full = np.zeros((h, w), dtype=np.uint8, order="F")
        full[top : top + ch, left : left + cw] = crop
        expected = mask_util.encode(full)
        counts = crop_to_counts(crop, top, left, (h, w))
        got = mask_util.frPyObjects([{"size": [h, w], "counts": counts}], h, w)[0]
        assert got["counts"] == expected["counts"]


def test_detections_to_coco_maps_frame_labels_and_threshold() -> None:
    label_map = LabelMap.from_coco_categories([{"id": 90, "name": "b"}, {"id": 3, "name": "a"}])
    scale = 0.5  # a 200x300 original resized to 100x150 then padded
    output = {
        # In the resized frame; the second box reaches into the padding (x up to 160), the
        # last lies wholly in it: clipped to the image's edge it has no area, and is dropped.
        "boxes": torch.tensor(
            [
                [10.0, 20.0, 30.0, 60.0],
                [100.0, 0.0, 160.0, 40.0],
                [0.0, 0.0, 5.0, 5.0],
                [155.0, 10.0, 170.0, 30.0],
            ]
        ),
        "labels": torch.tensor([1, 2, 1, 2]),
        "scores": torch.tensor([0.9, 0.7, 0.2, 0.8]),
        "masks": torch.ones(4, 1, 28, 28),
    }
    results = detections_to_coco(
        output,
        image_id=4242,
        scale=scale,
        orig_hw=(200, 300),
        label_map=label_map,
        score_threshold=0.5,
    )
    assert [r["category_id"] for r in results] == [3, 90]  # labels 1, 2 -> ids 3, 90
    assert [r["image_id"] for r in results] == [4242, 4242]
    assert results[0]["bbox"] == pytest.approx([20.0, 40.0, 40.0, 80.0])
    assert results[1]["bbox"] == pytest.approx([200.0, 0.0, 100.0, 80.0])  # clipped at w=300
    assert results[0]["score"] == pytest.approx(0.9)
    expected = paste_masks_rle(
        torch.tensor([[20.0, 40.0, 60.0, 120.0], [200.0, 0.0, 300.0, 80.0]]),
        torch.ones(2, 28, 28),
        (200, 300),
    )
    assert [r["segmentation"] for r in results] == expected
    decoded = mask_util.decode({"size": [200, 300], "counts": expected[0]["counts"].encode()})
    assert decoded[60, 40] == 1 and decoded[150, 150] == 0

    boxes_only = detections_to_coco(
        {k: v for k, v in output.items() if k != "masks"},
        image_id=1,
        scale=scale,
        orig_hw=(200, 300),
        label_map=label_map,
    )
    assert len(boxes_only) == 3 and all("segmentation" not in r for r in boxes_only)
