"""Datasets labelled in other tools' formats, converted to COCO once at registration.

One module per format reads that tool's documented layout into a
:class:`~maskops.data.formats.builder.CocoBuilder`; :func:`convert_labelled_dataset` writes
the resulting COCO file as ``<tag>_coco.json`` beside the shards and converts it like any
COCO dataset, the reader's findings (malformed records, unknown labels...) joining the
same per-image warnings file. :data:`FORMATS` is the registry: format name -> reader.

Why hand-written readers: Datumaro (which reads most of these) and label-studio-sdk refuse
this project's pins (pillow, numpy, pyjwt; docs/data-loop.md); each format's layout is
small and documented, and pycocotools does the masks.
Those libraries check the prediction exports from a virtualenv of their own
(tests/unit/data/test_export_interop.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from maskops.atomic import atomic_write
from maskops.data.coco import DatasetError
from maskops.data.convert import ConversionResult, ProgressFn, convert_dataset
from maskops.data.convert_options import DEFAULT_FORMAT, FORMAT_NAMES, ConvertOptions
from maskops.data.formats import cvat, labelme, labelstudio, via, voc, yolo_seg
from maskops.data.formats.builder import FORMAT_KINDS, CocoBuilder, FormatMismatch

Reader = Callable[[Path, CocoBuilder, Path], None]
"""``(annotations file or folder, builder, image folder)``."""


@dataclass(frozen=True)
class Format:
    name: str
    read: Reader | None
    """None: COCO itself, converted as it is."""
    expected: str
    """What the annotations must be (the message when they are not)."""
    folder: bool
    """The annotations are a folder (else one file)."""


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("coco", None, "a COCO instances JSON file", False),
        Format("via", lambda a, b, _: via.read(a, b), via.EXPECTED, False),
        Format("labelme", lambda a, b, _: labelme.read(a, b), labelme.EXPECTED, True),
        Format("cvat", lambda a, b, _: cvat.read(a, b), cvat.EXPECTED, False),
        Format("labelstudio", labelstudio.read, labelstudio.EXPECTED, False),
        Format("voc", voc.read, voc.EXPECTED, True),
        Format("yolo-seg", yolo_seg.read, yolo_seg.EXPECTED, True),
    )
}
assert tuple(FORMATS) == FORMAT_NAMES, "convert_options.py lists the registry's formats"

__all__ = [
    "DEFAULT_FORMAT",
    "FORMATS",
    "FORMAT_KINDS",
    "FORMAT_NAMES",
    "CocoBuilder",
    "FormatMismatch",
    "check_kept",
    "coco_path",
    "convert_labelled_dataset",
    "to_coco",
]


def coco_path(out_dir: Path, tag: str) -> Path:
    """Where the COCO file converted from another format is kept."""
    return out_dir / f"{tag}_coco.json"


def to_coco(
    format_name: str, annotations: Path, image_dir: Path, labels: Sequence[str] | None = None
) -> CocoBuilder:
    """Read ``annotations`` (a file or folder in ``format_name``) into COCO.

    Raises:
        DatasetError: an unknown format, or annotations missing.
        FormatMismatch: the annotations are not in that format (names what was expected).
    """
    if format_name not in FORMATS or FORMATS[format_name].read is None:
        raise DatasetError(f"format {format_name!r}: expected one of {', '.join(FORMATS)}")
    spec = FORMATS[format_name]
    if (spec.folder and not annotations.exists()) or (
        not spec.folder and not annotations.is_file()
    ):
        raise FormatMismatch(f"{annotations}: expected {spec.expected}; nothing there")
    builder = CocoBuilder(labels=list(labels) if labels is not None else None)
    read = spec.read
    assert read is not None
    read(annotations, builder, image_dir)
    return builder


def convert_labelled_dataset(
    image_dir: Path | str,
    annotations: Path | str,
    out_dir: Path | str,
    options: ConvertOptions | None = None,
    *,
    progress: ProgressFn | None = None,
    **option_values: Any,
) -> ConversionResult:
    """:func:`~maskops.data.convert.convert_dataset` for a dataset in any of :data:`FORMATS`.

    ``options`` (:class:`~maskops.data.convert_options.ConvertOptions`): its ``format_name``
    says how ``annotations`` are written, its ``labels`` the category names in id order (id
    1 first; names outside it are reported as ``unknown_label``); ``option_values`` (its
    field names) override single options.
    """
    options = replace(options or ConvertOptions(), **option_values)
    image_dir, annotations, out_dir = Path(image_dir), Path(annotations), Path(out_dir)
    tag = options.tag or annotations.stem
    options = replace(options, tag=tag)
    format_name = options.format_name
    if format_name == DEFAULT_FORMAT:
        return convert_dataset(image_dir, annotations, out_dir, options, progress=progress)
    builder = to_coco(format_name, annotations, image_dir, options.labels)
    check_kept(builder, f"{annotations.name} ({tag})")
    out_dir.mkdir(parents=True, exist_ok=True)
    converted = atomic_write(coco_path(out_dir, tag), json.dumps(builder.document()))
    return convert_dataset(
        image_dir,
        converted,
        out_dir,
        options,
        progress=progress,
        extra_findings=builder.findings,
        source={"format": format_name, "annotations": str(annotations.resolve())},
    )


def check_kept(builder: CocoBuilder, source: str) -> None:
    """Raise :class:`DatasetError` when ``builder`` read objects (or shapes it could not
    convert) but kept none, saying why and which ``labels`` to pass: a split that converts
    to nothing is a mistake, not a dataset (a VIA project whose regions name no label,
    read with several labels, kept 0 of 1,072 regions)."""
    found: dict[str, list[Any]] = {}
    for entry in builder.findings.values():
        for kind, items in entry.items():
            found.setdefault(kind, []).extend(items)
    unsupported = len(found.get("unsupported_shape", []))
    if builder.annotations or not (builder.objects or unsupported):
        return
    reasons = ", ".join(f"{kind} {len(v)}" for kind, v in found.items() if v and kind != "box")
    unknown = sorted({str(v) for v in found.get("unknown_label", [])})
    hint = "no object has a shape with an area (a polygon, box or mask)"
    if "" in unknown:
        hint = (
            "objects without a label (VIA regions with no label attribute) take the only "
            "name of labels: pass a single label, or label every object"
        )
    elif unknown:
        names = ", ".join(repr(name) for name in unknown[:20])
        hint = f"the labels found are {names}: pass labels naming them"
    raise DatasetError(
        f"{source}: no annotation kept of {builder.objects + unsupported} objects "
        f"({reasons}); {hint}"
    )
