"""YOLO segmentation (Ultralytics): one ``<stem>.txt`` per image.

Layout (Ultralytics' dataset docs): each line ``<class> x1 y1 x2 y2 ...``, the class a
0-based index and the coordinates normalised to the image's width and height; the class
names come from the user's label list (class k is label k+1) or a ``data.yaml`` /
``dataset.yaml`` (``names``: a list, or an index -> name map) in the labels folder or one
of its two parents. Images are ``<stem>`` with an image suffix under the image folder,
at the same relative path as the label file. A line is one object: an object in several
parts is written as one polygon with zero-width bridges between the parts, as
Ultralytics' own COCO converter does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pycocotools import mask as mask_utils

from maskops.data.formats.builder import BeyondLimit, CocoBuilder, FormatMismatch, open_image
from maskops.data.limits import MAX_LABEL_CHARS, MAX_LABELS
from maskops.masks import rle_to_polygons

EXPECTED = "a folder of YOLO segmentation .txt files ('<class> x1 y1 x2 y2 ...' per line)"
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
MAX_YAML_BYTES = 4 * 1024 * 1024
"""The largest data.yaml read: room for ``MAX_LABELS`` quoted names of ``MAX_LABEL_CHARS``."""


def read(annotations: Path, builder: CocoBuilder, image_dir: Path) -> None:
    files = sorted(annotations.rglob("*.txt")) if annotations.is_dir() else [annotations]
    files = [f for f in files if f.name != "classes.txt" and f.is_file()]  # no FIFO
    if not files:
        raise FormatMismatch(f"{annotations.name}: expected {EXPECTED}; none found")
    names = (
        list(builder.labels) if builder.labels is not None else _yaml_names(annotations, builder)
    )
    for path in files:
        relative = path.relative_to(annotations) if annotations.is_dir() else Path(path.name)
        stem = relative.with_suffix("")
        file_name = next(
            (
                (stem.as_posix() + s)
                for s in _IMAGE_SUFFIXES
                if (image_dir / (stem.as_posix() + s)).is_file()
            ),
            None,
        )
        if file_name is None:
            image_id = builder.add_image(stem.as_posix() + ".jpg")
            continue  # validation reports the missing file
        try:
            with open_image(image_dir / file_name) as image:
                width, height = image.size
            lines = path.read_text(encoding="utf-8").splitlines()
        except BeyondLimit as exc:
            builder.note(relative.as_posix(), "beyond_limit", f"{file_name}: {exc}")
            continue
        except (OSError, UnicodeDecodeError) as exc:
            builder.note(relative.as_posix(), "malformed_record", f"{relative}: {exc}")
            continue
        image_id = builder.add_image(file_name, width, height)
        for number, line in enumerate(lines, start=1):
            _line(builder, image_id, line, number, names, width, height)


def _line(
    builder: CocoBuilder,
    image_id: int,
    line: str,
    number: int,
    names: Sequence[str] | None,
    width: int,
    height: int,
) -> None:
    fields = line.split()
    if not fields:
        return
    try:
        index = int(fields[0])
        coords = [float(v) for v in fields[1:]]
    except ValueError:
        builder.note(image_id, "malformed_record", f"line {number}: not numbers")
        return
    if len(coords) % 2 or len(coords) < 4:
        # A polygon is x y pairs (a detection line cx cy w h, 4 numbers, is a box).
        builder.note(image_id, "malformed_record", f"line {number}: {len(coords)} coordinates")
        return
    if names is not None and not 0 <= index < len(names):
        builder.note(image_id, "unknown_label", f"class {index}")
        return
    label = names[index] if names is not None else str(index)
    if len(coords) == 4:  # a detection line (cx cy w h): the box
        cx, cy, w, h = coords
        coords = [
            cx - w / 2,
            cy - h / 2,
            cx + w / 2,
            cy - h / 2,
            cx + w / 2,
            cy + h / 2,
            cx - w / 2,
            cy + h / 2,
        ]
    polygon = [v * (width if k % 2 == 0 else height) for k, v in enumerate(coords)]
    builder.add_polygons(image_id, label, [polygon])


def _yaml_names(annotations: Path, builder: CocoBuilder) -> list[str] | None:
    """``names`` of the first data.yaml / dataset.yaml found; one that does not parse or
    has no usable ``names`` is a ``malformed_record`` (classes are then named by index)."""
    folder = annotations if annotations.is_dir() else annotations.parent
    for candidate in (folder, folder.parent, folder.parent.parent):
        for name in ("data.yaml", "dataset.yaml"):
            path = candidate / name
            if path.is_file():
                try:
                    names = _names(_load_yaml(path) or {})
                except (yaml.YAMLError, UnicodeDecodeError, TypeError, ValueError) as exc:
                    why = " ".join(str(exc).split())  # YAML's messages span lines
                    builder.note(name, "malformed_record", f"{name}: {why}")
                    continue
                if names is not None:
                    return names
    return None


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing aliases: a few hundred bytes of nested aliases
    otherwise stand for gigabytes once their values are turned into text."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases are not supported (*{event.anchor})", event.start_mark
            )
        return super().compose_node(parent, index)


def _load_yaml(path: Path) -> object:
    """A data.yaml of at most :data:`MAX_YAML_BYTES`, parsed without aliases."""
    with path.open("rb") as f:
        data = f.read(MAX_YAML_BYTES + 1)
    if len(data) > MAX_YAML_BYTES:
        raise ValueError(f"larger than {MAX_YAML_BYTES} bytes")
    return yaml.load(data.decode("utf-8"), Loader=_NoAliasLoader)


def _names(document: object) -> list[str] | None:
    """The class names of a parsed data.yaml (None: it names none): at most
    :data:`MAX_LABELS`, each text or a number of at most :data:`MAX_LABEL_CHARS`."""
    if not isinstance(document, dict):
        raise TypeError(f"expected a map with 'names', got a {type(document).__name__}")
    names = document.get("names")
    if isinstance(names, dict):
        names = [names[k] for k in sorted(names)]
    if names is None:
        return None
    if not isinstance(names, list):
        raise TypeError(f"names: expected a list or a map, got a {type(names).__name__}")
    if len(names) > MAX_LABELS:
        raise ValueError(f"names: {len(names)} names, above the limit of {MAX_LABELS}")
    for k, name in enumerate(names):
        if not isinstance(name, str | int | float) or len(str(name)) > MAX_LABEL_CHARS:
            raise ValueError(f"names[{k}]: not a name of at most {MAX_LABEL_CHARS} characters")
    return [str(n) for n in names]


def bridged(polygons: Sequence[Sequence[float]]) -> list[float]:
    """Several polygons as one, joined by zero-width bridges from the first polygon's
    vertex nearest each other part (Ultralytics' convention for multi-part objects)."""
    first = list(polygons[0])
    out: list[float] = []
    inserts: dict[int, list[float]] = {}
    for part in polygons[1:]:
        points = list(zip(part[0::2], part[1::2], strict=True))
        best = min(
            ((i, j) for i in range(len(first) // 2) for j in range(len(points))),
            key=lambda ij: math.dist(first[2 * ij[0] : 2 * ij[0] + 2], points[ij[1]]),
        )
        i, j = best
        loop = points[j:] + points[: j + 1]
        inserts.setdefault(i, []).extend([v for p in loop for v in p] + first[2 * i : 2 * i + 2])
    for i in range(len(first) // 2):
        out += first[2 * i : 2 * i + 2] + inserts.get(i, [])
    return out


def _one_outline(polygons: list[list[float]], height: int, width: int) -> list[list[float]]:
    """An object's parts as few polygons as its mask allows: parts that touch (an occluded
    object cut along its occluder's edges) become one outline, so no seam is lost."""
    if len(polygons) == 1:
        return polygons
    merged = mask_utils.merge(mask_utils.frPyObjects(polygons, height, width))
    return rle_to_polygons(merged, tolerance=0.0) or polygons


def write(document: dict[str, Any], folder: Path, labels: Sequence[str]) -> None:
    """A COCO document (polygon segmentations) as YOLO segmentation label files."""
    folder.mkdir(parents=True, exist_ok=True)
    index = {c["id"]: labels.index(c["name"]) for c in document["categories"]}
    by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in document["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    for image in document["images"]:
        width, height = image["width"], image["height"]
        lines = []
        for ann in by_image.get(image["id"], []):
            polygon = bridged(_one_outline(ann["segmentation"], height, width))
            coords = [v / (width if k % 2 == 0 else height) for k, v in enumerate(polygon)]
            lines.append(" ".join([str(index[ann["category_id"]])] + [f"{v:.6f}" for v in coords]))
        stem = Path(image["file_name"]).with_suffix("").as_posix()
        path = folder / f"{stem}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
