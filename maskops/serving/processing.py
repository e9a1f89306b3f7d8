"""The engine's in-process processing around the network, the served ensemble's reference.

In-process inference (``maskops predict``, evaluation) runs these torch functions
(``read_image`` + ``resize_and_pad``; ``detections_to_coco``). The Triton python models
cannot (no torch in the Triton image): they run the numpy/Pillow/pycocotools re-implementation in
``triton_models/maskops_serving_ops.py``, which tests/unit/serving/test_serving_ops_parity.py
and the real-Triton tests compare against these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from maskops.data.labels import LabelMap
from maskops.data.transforms import resize_and_pad
from maskops.evaluation.images import read_image
from maskops.evaluation.postprocess import detections_to_coco
from maskops.serving.protocol import decode_detections, encode_detections


def preprocess_image(
    data: bytes, image_size: tuple[int, int], *, name: str = "image", keep_uint8: bool = False
) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Decode an encoded image and prepare it for the graph.

    Args:
        data: JPEG/PNG bytes.
        image_size: the export's (H, W).
        keep_uint8: the pixels as uint8 0..255, as the served preprocess model hands them
            to the torch network (which divides them exactly as here).

    Returns:
        (float32 ``[3, H, W]`` in 0..1 (uint8 0..255 with ``keep_uint8``), resized keeping
        aspect ratio and padded; the resize scale; the original (height, width)).

    Raises:
        maskops.evaluation.ImageReadError: not a decodable image (message names ``name``).
    """
    image = read_image(data, name=name)
    orig_hw = (int(image.shape[1]), int(image.shape[2]))
    tensor, scale = resize_and_pad(image, image_size, keep_uint8=keep_uint8)
    return tensor.numpy(), float(scale), orig_hw


def unpad_detections(
    boxes: np.ndarray,
    scores: np.ndarray,
    labels: np.ndarray,
    masks: np.ndarray,
    num_detections: np.ndarray | int,
) -> dict[str, torch.Tensor]:
    """One image's model output from the graph's padded tensors (no batch dimension).

    Args:
        boxes ``[D, 4]``, scores ``[D]``, labels ``[D]``, masks ``[D, M, M]``, and the
        count of valid rows (rows past it are padding).

    Returns:
        The eager model's eval-output dict: boxes ``[N, 4]`` xyxy input frame, scores,
        labels int64, masks ``[N, 1, M, M]``.
    """
    n = int(np.asarray(num_detections).reshape(-1)[0])
    return {
        "boxes": torch.from_numpy(np.array(boxes[:n], dtype=np.float32)),
        "scores": torch.from_numpy(np.array(scores[:n], dtype=np.float32)),
        "labels": torch.from_numpy(np.array(labels[:n], dtype=np.int64)),
        "masks": torch.from_numpy(np.array(masks[:n], dtype=np.float32))[:, None],
    }


def coco_results(
    output: dict[str, torch.Tensor],
    *,
    scale: float,
    orig_hw: tuple[int, int],
    label_map: LabelMap,
    score_threshold: float,
    image_id: int = 0,
) -> list[dict[str, Any]]:
    """COCO results for one image, with ``category_name`` added for API clients."""
    results = detections_to_coco(
        output,
        image_id=image_id,
        scale=scale,
        orig_hw=orig_hw,
        label_map=label_map,
        score_threshold=score_threshold,
    )
    names = {c.id: c.name for c in label_map.categories}
    for result in results:
        result["category_name"] = names[result["category_id"]]
    return results


def encode_results(results: Sequence[dict[str, Any]]) -> bytes:
    """The JSON bytes the ensemble returns per image (:func:`protocol.encode_detections`)."""
    return encode_detections(results)


def decode_results(data: bytes | str) -> list[dict[str, Any]]:
    """The COCO results of a ``detections_json`` answer (:func:`protocol.decode_detections`)."""
    return decode_detections(data)
