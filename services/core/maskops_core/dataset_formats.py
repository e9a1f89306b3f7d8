"""The annotation formats a dataset may be registered in, and the check at the door.

The worker converts each format to COCO (``maskops.data.formats``, one reader per format);
the API only checks, before queuing that conversion, that what the client named looks like
the declared format, so that a VIA file declared as Label Studio is a 422 naming what was
expected rather than a failed job. The check reads structure only; every record is
checked (and each fault reported) by the conversion.
"""

from __future__ import annotations

import json
from pathlib import Path

from maskops.data.convert_options import FORMAT_NAMES, DatasetFormat

DATASET_FORMATS = FORMAT_NAMES
__all__ = ["DATASET_FORMATS", "EXPECTED", "DatasetFormat", "format_problem"]
FOLDER_FORMATS = frozenset({"labelme", "voc", "yolo-seg"})
"""Formats whose annotations are a folder (labelme also takes a single file)."""

EXPECTED: dict[str, str] = {
    "coco": "a COCO instances JSON file",
    "via": "a VIA JSON export (an object of images, each with 'filename' and 'regions')",
    "labelme": "LabelMe JSON files (one per image, with 'shapes' and 'imagePath')",
    "cvat": "a CVAT for images 1.1 XML file (root <annotations> with <image> elements)",
    "labelstudio": "a Label Studio JSON export (a list of tasks with 'data' and 'annotations')",
    "voc": "a Pascal VOC folder with SegmentationObject/ and SegmentationClass/ PNGs",
    "yolo-seg": "a folder of YOLO segmentation .txt files ('<class> x1 y1 x2 y2 ...' per line)",
}
"""What each format's annotations must be: the 422's wording."""
_SNIFF_BYTES = 4096


def format_problem(format_name: str, path: Path) -> str | None:
    """Why ``path`` is not annotations in ``format_name`` (a sentence naming what was
    expected), or None when it looks right (COCO is checked by its conversion)."""
    expected = f"expected {EXPECTED[format_name]}"
    if format_name in FOLDER_FORMATS and not path.is_dir():
        if format_name == "labelme" and path.suffix == ".json" and path.is_file():
            return None if _json_has(path, "shapes") else expected
        return f"{expected}; got a file"
    if format_name not in FOLDER_FORMATS and not path.is_file():
        return f"{expected}; got a folder"
    if format_name == "via":
        document = _json(path)
        if isinstance(document, dict):
            document = document.get("_via_img_metadata", document)
        ok = isinstance(document, dict) and any(
            isinstance(v, dict) and "regions" in v for v in document.values()
        )
    elif format_name == "labelstudio":
        document = _json(path)
        ok = isinstance(document, list) and any(
            isinstance(t, dict) and "data" in t for t in document
        )
    elif format_name == "cvat":
        with path.open("rb") as f:
            head = f.read(_SNIFF_BYTES)
        ok = b"<annotations" in head
    elif format_name == "labelme":
        files = [p for p in sorted(path.rglob("*.json"))[:50] if p.is_file()]  # no FIFO
        ok = any(_json_has(p, "shapes") for p in files)
    elif format_name == "voc":
        ok = (path / "SegmentationObject").is_dir() and (path / "SegmentationClass").is_dir()
    elif format_name == "yolo-seg":
        ok = any(p.name != "classes.txt" for p in path.rglob("*.txt"))
    else:
        ok = True
    return None if ok else expected


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _json_has(path: Path, key: str) -> bool:
    document = _json(path)
    return isinstance(document, dict) and key in document
