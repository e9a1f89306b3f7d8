"""Predictions sent back to labelling tools as pre-annotations for review.

From an inference run's label folder (per-image COCO results with RLE masks, and
:data:`~maskops.evaluation.inference.IMAGES_INDEX`), :func:`export_predictions` writes:

    ``coco``               ``predictions_coco_polygons.json`` and
                           ``predictions_coco_rle.json``: COCO documents (images,
                           categories, annotations with ``score``), the masks as polygons
                           or as RLE; either registers as a dataset again
    ``cvat``               ``predictions_cvat.xml``: CVAT for images 1.1, polygons with a
                           ``score`` attribute (CVAT: Upload annotations, "CVAT 1.1")
    ``labelstudio``        ``predictions_labelstudio.json``: tasks with ``predictions``
                           (model version, per-region and per-task scores) and
                           ``labelstudio_config.xml``, the labelling interface they match
    ``labelstudio-brush``  ``predictions_labelstudio_brush.json`` and
                           ``labelstudio_brush_config.xml``: the same with each mask as a
                           brush region (Label Studio's RLE), pixel for pixel, to correct
                           with the brush and eraser rather than by moving polygon points

Polygons (every export but the brush one) are the masks' outlines (:mod:`maskops.masks`),
simplified with ``tolerance`` pixels.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from maskops.atomic import atomic_path, atomic_write
from maskops.data.convert_options import PREDICTION_FORMATS
from maskops.data.formats import cvat, labelstudio
from maskops.masks import DEFAULT_TOLERANCE, rle_to_polygons

EXPORT_FORMATS = PREDICTION_FORMATS
INDEX_FILE = "coco_images.json"
"""The inference label folder's COCO skeleton (``maskops.evaluation.inference.IMAGES_INDEX``;
the engine's data package does not import the model code)."""


def read_label_dir(label_dir: Path) -> dict[str, Any]:
    """An inference label folder as one COCO document, detections as annotations (RLE)."""
    index = json.loads((label_dir / INDEX_FILE).read_text())
    annotations: list[dict[str, Any]] = []
    for path in sorted(label_dir.glob("*.json")):
        if path.name == INDEX_FILE or path.name.startswith("predictions_"):
            continue
        for detection in json.loads(path.read_text()):
            annotations.append(
                {k: v for k, v in detection.items() if k != "file_name"}
                | {
                    "id": len(annotations) + 1,
                    "iscrowd": 0,
                    "area": detection["bbox"][2] * detection["bbox"][3],
                }
            )
    return {
        "images": index["images"],
        "categories": index["categories"],
        "annotations": annotations,
    }


def with_polygons(annotations: Iterable[dict[str, Any]], tolerance: float) -> list[dict[str, Any]]:
    """The annotations with their RLE masks as polygons; those whose mask has no outline
    of 3 points or more (a speck) are left out."""
    out = []
    for ann in annotations:
        segmentation = ann.get("segmentation")
        if not isinstance(segmentation, dict):
            continue
        polygons = rle_to_polygons(segmentation, tolerance)
        if polygons:
            out.append(ann | {"segmentation": polygons})
    return out


def export_predictions(
    label_dir: Path,
    out_dir: Path,
    formats: Sequence[str],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    model_version: str = "maskops",
    image_url: str = "/data/local-files/?d=",
) -> list[Path]:
    """Write the requested :data:`EXPORT_FORMATS` of an inference label folder; the files.

    Raises:
        ValueError: an unknown format name.
    """
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown:
        raise ValueError(f"export formats {unknown}: expected some of {', '.join(EXPORT_FORMATS)}")
    document = read_label_dir(label_dir)
    images, categories = document["images"], document["categories"]
    polygons = with_polygons(document["annotations"], tolerance)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def write(name: str, content: str) -> None:
        """Readers of ``name`` see the whole file or none."""
        written.append(atomic_write(out_dir / name, content))

    if "coco" in formats:
        write("predictions_coco_polygons.json", json.dumps(document | {"annotations": polygons}))
        write("predictions_coco_rle.json", json.dumps(document))
    if "cvat" in formats:
        path = out_dir / "predictions_cvat.xml"
        with atomic_path(path) as partial:
            cvat.write(images, polygons, categories, partial)
        written.append(path)
    for name, brush in (("labelstudio", False), ("labelstudio-brush", True)):
        if name not in formats:
            continue
        # Brush regions are the masks themselves (RLE), the others their outlines.
        tasks = labelstudio.tasks(
            images,
            document["annotations"] if brush else polygons,
            categories,
            image_url=image_url,
            model_version=model_version,
            brush=brush,
        )
        stem = name.replace("-", "_")
        write(f"predictions_{stem}.json", json.dumps(tasks))
        write(f"{stem}_config.xml", labelstudio.labeling_config(categories, brush=brush))
    return written
