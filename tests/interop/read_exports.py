"""Read maskops' prediction exports with the labelling tools' own libraries; print what
they read as JSON. Runs in the interop virtualenv (requirements.txt beside this file says
why it is not the project's). It judges nothing itself: tests/unit/data/test_export_interop.py
compares the report with maskops' masks.

    python read_exports.py EXPORT_DIR

Datumaro imports ``predictions_cvat.xml`` as "cvat" (CVAT for images 1.1). Datumaro has
no Label Studio importer; label-studio-sdk's ``LabelInterface`` validates each task's
prediction against the labelling config exported beside it (control and object names,
region types, labels, values), and its converter's ``decode_rle`` decodes the brush masks.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from datumaro.components.annotation import AnnotationType
from datumaro.components.dataset import Dataset
from label_studio_sdk.converter.brush import decode_rle
from label_studio_sdk.label_interface import LabelInterface
from pycocotools import mask as mask_utils


def read_cvat(path: Path) -> dict[str, Any]:
    dataset = Dataset.import_from(str(path), "cvat")
    names = [c.name for c in dataset.categories()[AnnotationType.label].items]
    items: dict[str, list[dict[str, Any]]] = {}
    for item in dataset:
        items[item.id] = [
            {
                "type": ann.type.name,
                "label": names[ann.label],
                "points": [float(v) for v in getattr(ann, "points", [])],
                "score": float(ann.attributes["score"]),
                "group": ann.group or f"shape {k}",  # 0: no group
            }
            for k, ann in enumerate(item.annotations)
        ]
    return {"labels": names, "items": items}


def read_labelstudio(tasks_path: Path, config_path: Path) -> dict[str, Any]:
    interface = LabelInterface(config_path.read_text())
    try:
        interface.validate()
        config_error = None
    except Exception as exc:  # the SDK raises its own validation errors
        config_error = repr(exc)
    tasks = []
    for task in json.loads(tasks_path.read_text()):
        (prediction,) = task["predictions"]
        regions = [_region(r) for r in prediction["result"]]
        errors = interface.validate_prediction(prediction, return_errors=True)
        tasks.append({"image": task["data"]["image"], "errors": errors, "regions": regions})
    return {"config_error": config_error, "tasks": tasks}


def _region(region: dict[str, Any]) -> dict[str, Any]:
    value = region["value"]
    width, height = region["original_width"], region["original_height"]
    if region["type"] == "polygonlabels":
        points = [v for x, y in value["points"] for v in (x * width / 100, y * height / 100)]
        group = region.get("group_id", region["id"])
        return {"label": value["polygonlabels"][0], "points": points, "group": group}
    alpha = np.reshape(decode_rle(value["rle"]), [height, width, 4])[:, :, 3]
    rle = mask_utils.encode(np.asfortranarray((alpha > 0).astype(np.uint8)))
    return {
        "label": value["brushlabels"][0],
        "counts": rle["counts"].decode(),
        "size": [height, width],
    }


def main(export_dir: Path) -> None:
    report = {
        "versions": {d: metadata.version(d) for d in ("datumaro", "label-studio-sdk", "numpy")},
        "cvat": read_cvat(export_dir / "predictions_cvat.xml"),
        "labelstudio": read_labelstudio(
            export_dir / "predictions_labelstudio.json", export_dir / "labelstudio_config.xml"
        ),
        "labelstudio-brush": read_labelstudio(
            export_dir / "predictions_labelstudio_brush.json",
            export_dir / "labelstudio_brush_config.xml",
        ),
    }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
