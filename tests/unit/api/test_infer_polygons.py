"""``/infer?mask_format=polygon``: the masks Triton returns as COCO RLE are answered as
polygons that cover them (IoU >= 0.95), decoded without pycocotools (the API has none)."""

from __future__ import annotations

import io
import json

import numpy as np
from fastapi.testclient import TestClient
from PIL import Image
from pycocotools import mask as mask_utils

from maskops.data.demo import DemoDataset
from maskops.masks import rle_to_mask
from maskops_api.routes.infer import as_polygons


def test_polygons_cover_the_rle_masks(demo_dataset: DemoDataset) -> None:
    source = json.loads(demo_dataset.val_json.read_text())
    detections = []
    for ann in source["annotations"]:
        rle = mask_utils.merge(mask_utils.frPyObjects(ann["segmentation"], 128, 128))
        detections.append(
            {
                "image_id": 0,
                "category_id": ann["category_id"],
                "bbox": ann["bbox"],
                "score": 0.9,
                "segmentation": {"size": [128, 128], "counts": rle["counts"].decode()},
            }
        )
    detections.append(detections[0] | {"segmentation": None})  # a boxes-only model's answer
    answered = as_polygons(detections, 1.0)
    assert answered[-1]["segmentation"] is None
    for before, after in zip(detections[:-1], answered[:-1], strict=True):
        rle = before["segmentation"] | {"counts": before["segmentation"]["counts"].encode()}
        assert np.array_equal(rle_to_mask(before["segmentation"]), mask_utils.decode(rle))
        drawn = mask_utils.merge(mask_utils.frPyObjects(after["segmentation"], 128, 128))
        assert mask_utils.iou([rle], [drawn], [0])[0][0] >= 0.95
        assert {k: v for k, v in after.items() if k != "segmentation"} == {
            k: v for k, v in before.items() if k != "segmentation"
        }


def test_an_unknown_mask_format_is_a_422(client: TestClient) -> None:
    image = io.BytesIO()
    Image.new("RGB", (16, 16)).save(image, "PNG")
    response = client.post(
        "/infer",
        params={"model": "shapes", "mask_format": "bitmap"},
        files=[("images", ("x.png", image.getvalue()))],
    )
    assert response.status_code == 422 and "mask_format" in response.text
