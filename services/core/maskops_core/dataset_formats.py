"""The annotation formats a dataset may be registered in, and the check at the door.

The worker converts each format to COCO (``maskops.data.formats``, one reader per format);
the API only checks, before queuing that conversion, that what the client named looks like
the declared format, so that a VIA file declared as Label Studio is a 422 naming what was
expected rather than a failed job. The check reads at most :data:`SNIFF_BYTES` of a file,
never parsing it whole: parsing a 47 MB VIA file took 270 MB and 11.7 s of the API's
process, the prefix 0.2 ms (2026-11-27, a shared 2-core Xeon), and a deeply nested file
overflowed the recursion limit (a 500). Every record is parsed and checked (and each
fault reported) by the conversion, in the worker.
"""

from __future__ import annotations

from pathlib import Path

from maskops.data.convert_options import FORMAT_NAMES, DatasetFormat
from maskops.data.limits import MAX_LABEL_CHARS, MAX_LABELS

DATASET_FORMATS = FORMAT_NAMES
__all__ = [
    "DATASET_FORMATS",
    "EXPECTED",
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "DatasetFormat",
    "format_problem",
]
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
SNIFF_BYTES = 64 * 1024
"""The most of an annotation file the check reads."""
_LABELME_FILES = 50
"""LabelMe files of a folder the check reads (one of them must look right)."""
_JSON_SNIFFS: dict[str, tuple[str, tuple[str, ...]]] = {
    # format: (how the document opens, keys one of which must appear in the prefix)
    "via": ("{", ('"regions"', '"_via_img_metadata"')),
    "labelstudio": ("[{", ('"data"', '"annotations"', '"predictions"')),
    "labelme": ("{", ('"shapes"',)),
}


def format_problem(format_name: str, path: Path) -> str | None:
    """Why ``path`` is not annotations in ``format_name`` (a sentence naming what was
    expected), or None when it looks right (COCO is checked by its conversion)."""
    expected = f"expected {EXPECTED[format_name]}"
    if format_name in FOLDER_FORMATS and not path.is_dir():
        if format_name == "labelme" and path.suffix == ".json" and path.is_file():
            return None if _looks_like(path, "labelme") else expected
        return f"{expected}; got a file"
    if format_name not in FOLDER_FORMATS and not path.is_file():
        return f"{expected}; got a folder"
    if format_name in ("via", "labelstudio"):
        ok = _looks_like(path, format_name)
    elif format_name == "cvat":
        ok = "<annotations" in _head(path)
    elif format_name == "labelme":
        files = [p for p in sorted(path.rglob("*.json"))[:_LABELME_FILES] if p.is_file()]
        ok = any(_looks_like(p, "labelme") for p in files)  # is_file: no FIFO
    elif format_name == "voc":
        ok = (path / "SegmentationObject").is_dir() and (path / "SegmentationClass").is_dir()
    elif format_name == "yolo-seg":
        ok = any(p.name != "classes.txt" for p in path.rglob("*.txt"))
    else:
        ok = True
    return None if ok else expected


def _head(path: Path) -> str:
    """The file's first :data:`SNIFF_BYTES` as text, without a byte-order mark or leading
    whitespace (a multi-byte character cut at the end is dropped)."""
    with path.open("rb") as f:
        head = f.read(SNIFF_BYTES)
    return head.decode("utf-8", errors="ignore").lstrip("\ufeff \t\r\n")


def _looks_like(path: Path, format_name: str) -> bool:
    """Whether the JSON file opens as ``format_name``'s documents do and names one of its
    keys within the prefix read (JSON allows whitespace between the opening brackets)."""
    opening, keys = _JSON_SNIFFS[format_name]
    head = _head(path)
    rest = head
    for bracket in opening:
        if not rest.startswith(bracket):
            return False
        rest = rest[1:].lstrip(" \t\r\n")
    return any(key in head for key in keys)
