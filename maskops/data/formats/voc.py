"""Pascal VOC segmentation: instance masks as indexed PNGs.

Layout (VOC2012): a root folder with ``SegmentationObject/<stem>.png`` (pixel value k: the
image's k-th object, 0 background, 255 the "void" border) and
``SegmentationClass/<stem>.png`` (pixel value: class index, 1-based), optionally
``Annotations/<stem>.xml`` (the objects' boxes, in the same order as the object indices).
The images are ``<stem>.jpg`` (or ``.png``) in the image folder. Class index ``k`` is the
user's label ``k`` (1-based), else VOC's own 20 classes. An object whose XML box and
mask overlap less than the builder's threshold is reported (``mask_polygon_mismatch``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

from maskops.data.formats.builder import (
    BeyondLimit,
    CocoBuilder,
    FormatMismatch,
    check_pixels,
    open_image,
    rectangle,
)

EXPECTED = "a Pascal VOC folder with SegmentationObject/ and SegmentationClass/ PNGs"
VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
    "train", "tvmonitor",
)  # fmt: skip
_VOID = 255
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_INDEX_MODES = ("P", "L")


def read(annotations: Path, builder: CocoBuilder, image_dir: Path) -> None:
    root = annotations.parent if annotations.name == "SegmentationObject" else annotations
    objects_dir, classes_dir = root / "SegmentationObject", root / "SegmentationClass"
    if not objects_dir.is_dir() or not classes_dir.is_dir():
        raise FormatMismatch(f"{annotations.name}: expected {EXPECTED}")
    names = list(builder.labels) if builder.labels is not None else list(VOC_CLASSES)
    for path in sorted(objects_dir.glob("*.png")):
        file_name = next(
            (path.stem + s for s in _IMAGE_SUFFIXES if (image_dir / (path.stem + s)).exists()),
            path.stem + ".jpg",
        )
        try:
            objects, classes = _indices(path), _indices(classes_dir / path.name)
            if objects.shape != classes.shape:
                raise ValueError("object and class PNGs must be equal-sized")
        except BeyondLimit as exc:
            builder.note(path.name, "beyond_limit", f"{path.name}: {exc}")
            continue
        except (OSError, ValueError) as exc:
            builder.note(path.name, "malformed_record", f"{path.name}: {exc}")
            continue
        height, width = objects.shape
        image_id = builder.add_image(file_name, width, height)
        boxes = _xml_boxes(root / "Annotations" / f"{path.stem}.xml")
        for k in sorted(int(v) for v in np.unique(objects) if v not in (0, _VOID)):
            mask = objects == k
            values, counts = np.unique(classes[mask], return_counts=True)
            index = int(values[np.argmax(counts)])
            if not 1 <= index <= len(names):
                builder.note(image_id, "unknown_label", f"class index {index}")
                continue
            box = boxes[k - 1] if k - 1 < len(boxes) else None
            builder.add_mask(image_id, names[index - 1], mask, drawn_as=box)


def _indices(path: Path) -> np.ndarray:
    """An 8-bit single-channel PNG's pixels (height x width), its size checked from the
    header before decoding. VOC's are palette PNGs, so at most 254 objects an image: a
    16-bit instance map (a few KB may hold thousands of objects, each a pass over the
    whole image) is refused."""
    with open_image(path) as image:
        check_pixels(*image.size)
        if image.mode not in _INDEX_MODES:
            raise ValueError(f"expected an 8-bit palette or grayscale PNG, got mode {image.mode}")
        return np.asarray(image)


def _xml_boxes(path: Path) -> list[list[float]]:
    """The objects' boxes from VOC's XML (pixel-inclusive corners, 1-based) as polygons."""
    if not path.is_file():
        return []
    try:
        root = ET.parse(path).getroot()
        boxes = []
        for box in root.iter("bndbox"):
            x0, y0, x1, y1 = (
                float(box.findtext(k) or "nan") for k in ("xmin", "ymin", "xmax", "ymax")
            )
            boxes.append(rectangle(x0 - 1, y0 - 1, x1, y1))
        return boxes
    except (ET.ParseError, ValueError):
        return []


def write(document: dict[str, Any], root: Path, labels: Sequence[str]) -> None:
    """A COCO document as VOC SegmentationObject/SegmentationClass PNGs (``labels``: the
    class order); later objects paint over earlier ones where they overlap."""
    for sub in ("SegmentationObject", "SegmentationClass"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    index = {c["id"]: labels.index(c["name"]) + 1 for c in document["categories"]}
    by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in document["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    palette = [v for k in range(256) for v in (k * 37 % 256, k * 91 % 256, k * 53 % 256)]
    for image in document["images"]:
        height, width = image["height"], image["width"]
        objects = np.zeros((height, width), dtype=np.uint8)
        classes = np.zeros((height, width), dtype=np.uint8)
        for k, ann in enumerate(by_image.get(image["id"], []), start=1):
            segmentation = ann["segmentation"]
            rles = (
                mask_utils.frPyObjects(segmentation, height, width)
                if isinstance(segmentation, list)
                else [mask_utils.frPyObjects(segmentation, height, width)]
            )
            mask = mask_utils.decode(mask_utils.merge(rles)).astype(bool)
            objects[mask], classes[mask] = k, index[ann["category_id"]]
        stem = Path(image["file_name"]).stem
        for sub, array in (("SegmentationObject", objects), ("SegmentationClass", classes)):
            png = Image.fromarray(array, mode="P")
            png.putpalette(palette)
            png.save(root / sub / f"{stem}.png")
