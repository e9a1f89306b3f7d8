"""CVAT for images 1.1 (CVAT's XML export): read for datasets, written for predictions.

Layout: ``<annotations><version>1.1</version><meta>...<labels><label><name>``,
then per image ``<image id name width height>`` holding ``<polygon label points="x,y;x,y"
group_id>``, ``<box label xtl ytl xbr ybr>`` and ``<mask label rle left top width
height>`` (``rle``: run lengths over the mask's box in row-major order, starting with a
run of background). Shapes with the same label and ``group_id`` are one object.
``polyline``, ``points``, ``cuboid``, ``ellipse`` and ``skeleton`` are not converted.
(CVAT's COCO export is plain COCO: declare ``coco`` for it.)

The standard library's parser reads the file: it resolves no external entity, and the
expat it links (2.4.1 or later) refuses entity-expansion bombs.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from maskops.data.formats.builder import (
    BeyondLimit,
    CocoBuilder,
    FormatMismatch,
    check_pixels,
    rectangle,
)

EXPECTED = "a CVAT for images 1.1 XML file (root <annotations> with <image> elements)"


def read(annotations: Path, builder: CocoBuilder) -> None:
    try:
        root = ET.parse(annotations).getroot()
    except (ET.ParseError, UnicodeDecodeError) as exc:
        raise FormatMismatch(f"{annotations.name}: expected {EXPECTED}: {exc}") from None
    if root.tag != "annotations" or (root.find("image") is None and root.find("meta") is None):
        raise FormatMismatch(f"{annotations.name}: expected {EXPECTED}, got <{root.tag}>")
    for index, element in enumerate(root.iter("image")):
        try:
            name = element.attrib["name"]
            width, height = int(element.attrib["width"]), int(element.attrib["height"])
            if not name or width <= 0 or height <= 0:
                raise ValueError(f"name {name!r}, width {width}, height {height}")
        except (KeyError, ValueError) as exc:
            builder.note(annotations.name, "malformed_record", f"image[{index}]: {exc!r}")
            continue
        _image(builder, builder.add_image(name, width, height), element, width, height)


def _image(
    builder: CocoBuilder, image_id: int, element: ET.Element, width: int, height: int
) -> None:
    objects: dict[object, tuple[str, list[list[float]]]] = {}
    for index, shape in enumerate(element):
        try:
            label = shape.attrib["label"]
            if shape.tag == "mask":
                if builder.room(image_id):  # asked first: the mask is decoded at full size
                    builder.add_mask(image_id, label, _mask(shape.attrib, width, height))
                continue
            polygon = _polygon(shape)
        except BeyondLimit as exc:
            builder.note(image_id, "beyond_limit", f"<{shape.tag}> {index}: {exc}")
            continue
        except (KeyError, ValueError, OverflowError) as exc:  # int(float("1e999"))
            builder.note(image_id, "malformed_record", f"<{shape.tag}> {index}: {exc!r}")
            continue
        if polygon is None:
            builder.note(image_id, "unsupported_shape", shape.tag)
            continue
        group = shape.attrib.get("group_id")
        key = (label, group) if group not in (None, "", "0") else index
        objects.setdefault(key, (label, []))[1].append(polygon)
    for label, polygons in objects.values():
        builder.add_polygons(image_id, label, polygons)


def _polygon(shape: ET.Element) -> list[float] | None:
    if shape.tag == "polygon":
        return [float(v) for pair in shape.attrib["points"].split(";") for v in pair.split(",")]
    if shape.tag == "box":
        a = shape.attrib
        return rectangle(float(a["xtl"]), float(a["ytl"]), float(a["xbr"]), float(a["ybr"]))
    return None


def _mask(attrib: dict[str, str], width: int, height: int) -> np.ndarray:
    """The mask (uint8, height x width, Fortran order as pycocotools encodes it); raises
    :class:`BeyondLimit` before allocating more than the image pixel limit."""
    left, top = int(float(attrib["left"])), int(float(attrib["top"]))
    box_w, box_h = int(float(attrib["width"])), int(float(attrib["height"]))
    check_pixels(width, height)
    check_pixels(box_w, box_h)
    if min(left, top, box_w, box_h) < 0:
        raise ValueError(f"box at {left}, {top} of {box_w} x {box_h} pixels")
    runs = [int(v) for v in attrib["rle"].split(",")]
    if sum(runs) != box_w * box_h:
        raise ValueError(f"rle covers {sum(runs)} pixels, the box {box_w * box_h}")
    values = np.repeat((np.arange(len(runs)) % 2).astype(np.uint8), runs)
    full = np.zeros((height, width), dtype=np.uint8, order="F")
    crop = values.reshape(box_h, box_w)[: max(0, height - top), : max(0, width - left)]
    full[top : top + crop.shape[0], left : left + crop.shape[1]] = crop
    return full


def write(
    images: Sequence[dict[str, Any]],
    annotations: Sequence[dict[str, Any]],
    categories: Sequence[dict[str, Any]],
    path: Path,
) -> None:
    """COCO images and polygon annotations (``score`` optional) as CVAT for images 1.1.

    A score becomes the shape's ``score`` attribute (declared on every label), to sort
    and filter on in CVAT.
    """
    root = ET.Element("annotations")
    ET.SubElement(root, "version").text = "1.1"
    labels = ET.SubElement(ET.SubElement(ET.SubElement(root, "meta"), "task"), "labels")
    scored = any("score" in a for a in annotations)
    for category in categories:
        label = ET.SubElement(labels, "label")
        ET.SubElement(label, "name").text = category["name"]
        attributes = ET.SubElement(label, "attributes")
        if scored:
            attribute = ET.SubElement(attributes, "attribute")
            for key, value in (("name", "score"), ("mutable", "False"), ("input_type", "text")):
                ET.SubElement(attribute, key).text = value
            ET.SubElement(attribute, "default_value").text = ""
            ET.SubElement(attribute, "values").text = ""
    names = {c["id"]: c["name"] for c in categories}
    by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in annotations:
        by_image.setdefault(ann["image_id"], []).append(ann)
    for index, image in enumerate(images):
        element = ET.SubElement(
            root,
            "image",
            id=str(index),
            name=image["file_name"],
            width=str(image["width"]),
            height=str(image["height"]),
        )
        for ann in by_image.get(image["id"], []):
            group = str(ann["id"]) if len(ann["segmentation"]) > 1 else "0"
            for polygon in ann["segmentation"]:
                points = ";".join(
                    f"{x:.2f},{y:.2f}" for x, y in zip(polygon[0::2], polygon[1::2], strict=True)
                )
                shape = ET.SubElement(
                    element,
                    "polygon",
                    label=names[ann["category_id"]],
                    occluded="0",
                    points=points,
                    z_order="0",
                    group_id=group,
                )
                if "score" in ann:
                    ET.SubElement(shape, "attribute", name="score").text = f"{ann['score']:.4f}"
    ET.indent(root)
    path.write_bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))
