"""Label Studio: the JSON export read for datasets, pre-annotations written for predictions.

Layout (Label Studio's "JSON" export): a list of tasks ``{"id", "data": {"image": url},
"annotations": [{"result": [region, ...]}]}``; a region is ``{"type": "polygonlabels",
"original_width", "original_height", "value": {"points": [[x%, y%], ...],
"polygonlabels": [label]}}`` or ``rectanglelabels`` (``x``, ``y``, ``width``, ``height``
in percent) or ``brushlabels`` (``value: {"format": "rle", "rle": [...]}``, Label
Studio's own bit-packed RLE of the RGBA image, :mod:`.labelstudio_rle`; one mask, one
object). Coordinates are percent of the image. The first annotation of a task is used
(a task's later annotations are other people's versions of the same objects); a task
without annotations gives its first ``predictions`` (pre-annotations) instead. Label
Studio has no polygon object in several parts: regions sharing a ``group_id`` key
(maskops writes one for an occluded object) and a label are one object.

The image is the base name of ``data.image``; Label Studio prefixes uploads with 8 hex
digits and a dash (``3f2a1b2c-x.jpg``), dropped when only the plain name is on disk.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from html import escape
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from maskops.data.formats import labelstudio_rle
from maskops.data.formats.builder import CocoBuilder, FormatMismatch, rectangle
from maskops.masks import rle_to_mask

EXPECTED = "a Label Studio JSON export (a list of tasks with 'data' and 'annotations')"
_UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{8}-")


def read(annotations: Path, builder: CocoBuilder, image_dir: Path) -> None:
    try:
        tasks = json.loads(annotations.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # too deep
        raise FormatMismatch(f"{annotations.name}: expected {EXPECTED}: not JSON ({exc})") from None
    if not isinstance(tasks, list) or not any(isinstance(t, dict) and "data" in t for t in tasks):
        raise FormatMismatch(f"{annotations.name}: expected {EXPECTED}")
    for index, task in enumerate(tasks):
        try:
            file_name = _file_name(task["data"], image_dir)
            # Pre-annotations (``predictions``) read as well when nobody annotated the task.
            done = task.get("annotations") or task.get("predictions") or [{}]
            results = done[0].get("result") or []
            if not isinstance(results, list):
                raise TypeError(f"result: expected a list of regions, got {results!r}")
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
            builder.note(annotations.name, "malformed_record", f"tasks[{index}]: {exc!r}")
            continue
        _task(builder, file_name, results)


def _file_name(data: dict[str, Any], image_dir: Path) -> str:
    if not data:
        raise ValueError("data: no image")
    url = urlparse(str(data.get("image") or next(iter(data.values()))))
    # Local storage serves "/data/local-files/?d=<path>": the path is the query.
    local = parse_qs(url.query).get("d")
    name = PurePosixPath(unquote(local[0] if local else url.path)).name
    if not name:
        raise ValueError(f"data: no image file name in {data!r}")
    if not (image_dir / name).exists() and _UPLOAD_PREFIX.match(name):
        plain = _UPLOAD_PREFIX.sub("", name)
        if (image_dir / plain).exists():
            return plain
    return name


def _task(builder: CocoBuilder, file_name: str, results: list[Any]) -> None:
    size = next(
        (
            (r["original_width"], r.get("original_height"))
            for r in results
            if isinstance(r, dict) and "original_width" in r
        ),
        (None, None),
    )
    image_id = builder.add_image(file_name, *size)
    objects: dict[object, tuple[str, list[list[float]]]] = {}
    for index, region in enumerate(results):
        try:
            kind = region["type"]
            if kind not in ("polygonlabels", "rectanglelabels", "brushlabels"):
                builder.note(image_id, "unsupported_shape", kind)
                continue
            value = region["value"]
            label = value[kind][0]
            if not isinstance(label, str):
                raise TypeError(f"{kind}: expected label names, got {value[kind]!r}")
            w, h = float(region["original_width"]), float(region["original_height"])
            if not (w > 0 and h > 0):
                raise ValueError(f"original_width x original_height {w} x {h}: not positive")
            if kind == "brushlabels":
                # A brush stroke is one object; parts drawn apart are one mask already.
                if value.get("format", "rle") != "rle":
                    builder.note(image_id, "unsupported_shape", f"brush {value['format']}")
                    continue
                if builder.room(image_id):  # asked first: the mask is decoded at full size
                    builder.add_mask(
                        image_id, label, labelstudio_rle.to_mask(value["rle"], int(w), int(h))
                    )
                continue
            polygon = _polygon(kind, value, w / 100, h / 100)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            builder.note(image_id, "malformed_record", f"result[{index}]: {exc!r}")
            continue
        group = region.get("group_id")
        key = (label, str(group)) if group is not None else index
        objects.setdefault(key, (label, []))[1].append(polygon)
    for label, polygons in objects.values():
        builder.add_polygons(image_id, label, polygons)


def _polygon(kind: str, value: dict[str, Any], w: float, h: float) -> list[float]:
    """A polygon or rectangle region in pixels (``w``, ``h``: pixels per percent)."""
    if kind == "polygonlabels":
        return [v for x, y in value["points"] for v in (float(x) * w, float(y) * h)]
    x, y = float(value["x"]) * w, float(value["y"]) * h
    return rectangle(x, y, x + float(value["width"]) * w, y + float(value["height"]) * h)


def tasks(
    images: Sequence[dict[str, Any]],
    annotations: Sequence[dict[str, Any]],
    categories: Sequence[dict[str, Any]],
    *,
    image_url: str = "/data/local-files/?d=",
    model_version: str | None = None,
    brush: bool = False,
) -> list[dict[str, Any]]:
    """COCO images and annotations as Label Studio tasks: ``annotations`` when no
    ``model_version`` is given, else ``predictions`` (pre-annotations) carrying it, each
    region's ``score`` and the task's mean score. Regions are polygons (polygon
    segmentations), or with ``brush`` brush masks (RLE segmentations; empty ones left out)."""
    names = {c["id"]: c["name"] for c in categories}
    by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in annotations:
        by_image.setdefault(ann["image_id"], []).append(ann)
    regions = _brush_regions if brush else _regions
    out = []
    for image in images:
        anns = by_image.get(image["id"], [])
        results = [r for ann in anns for r in regions(ann, names, image)]
        entry: dict[str, Any] = {"result": results}
        task: dict[str, Any] = {"data": {"image": image_url + image["file_name"]}}
        if model_version is None:
            task["annotations"] = [entry]
        else:
            scores = [float(a["score"]) for a in anns if "score" in a]
            entry |= {"model_version": model_version, "score": sum(scores) / max(len(scores), 1)}
            task["predictions"] = [entry]
        out.append(task)
    return out


def _region(kind: str, ann: dict[str, Any], image: dict[str, Any], value: dict[str, Any]) -> Any:
    region = {
        "id": uuid.uuid4().hex[:10],
        "type": kind,
        "from_name": "label",
        "to_name": "image",
        "original_width": image["width"],
        "original_height": image["height"],
        "image_rotation": 0,
        "value": value,
    }
    if "score" in ann:
        region["score"] = float(ann["score"])
    return region


def _regions(ann: dict[str, Any], names: dict[int, str], image: dict[str, Any]) -> list[Any]:
    width, height = image["width"], image["height"]
    group = {"group_id": str(ann["id"])} if len(ann["segmentation"]) > 1 else {}
    regions = []
    for polygon in ann["segmentation"]:
        points = [
            [100 * x / width, 100 * y / height]
            for x, y in zip(polygon[0::2], polygon[1::2], strict=True)
        ]
        value = {"points": points, "closed": True, "polygonlabels": [names[ann["category_id"]]]}
        regions.append(_region("polygonlabels", ann, image, value) | group)
    return regions


def _brush_regions(ann: dict[str, Any], names: dict[int, str], image: dict[str, Any]) -> list[Any]:
    mask = rle_to_mask(ann["segmentation"])
    if not mask.any():
        return []
    rle = labelstudio_rle.from_mask(mask)
    value = {"format": "rle", "rle": rle, "brushlabels": [names[ann["category_id"]]]}
    return [_region("brushlabels", ann, image, value)]


def labeling_config(categories: Sequence[dict[str, Any]], *, brush: bool = False) -> str:
    """The labelling interface the tasks' regions refer to (``label`` on ``image``)."""
    labels = "\n".join(f'    <Label value="{escape(c["name"], quote=True)}"/>' for c in categories)
    control = "BrushLabels" if brush else "PolygonLabels"
    return (
        "<View>\n"
        '  <Image name="image" value="$image" zoom="true"/>\n'
        f'  <{control} name="label" toName="image">\n'
        f"{labels}\n"
        f"  </{control}>\n"
        "</View>\n"
    )


def write(document: dict[str, Any], path: Path) -> None:
    """A COCO document (polygon segmentations) as a Label Studio JSON export."""
    path.write_text(
        json.dumps(tasks(document["images"], document["annotations"], document["categories"]))
    )
