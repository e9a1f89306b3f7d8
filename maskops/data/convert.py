"""``dataset_convert``: a COCO instances file and its images in, validated shards out.

Output in ``out_dir`` (``tag`` defaults to the annotation file's stem, as in TAO):
``<tag>-NNNNN-of-MMMMM.tar`` shards (format: :mod:`maskops.data.shards`), a manifest
``<tag>_manifest.json`` (:mod:`maskops.data.manifest`) and ``<tag>_warnings.json``: every
finding keyed by image id in TAO's shape, extended with maskops' kinds
(``{"200365": {"box": [918], "mask": [], "size_mismatch": ["json 640x480, file 480x640"]}}``;
the kinds are listed in :mod:`maskops.data.validate`).

Streaming: images are processed in order by a small process pool (forked before the JSON
is read, so workers stay small) with a bounded window of work in flight, and written
straight into the current shard. Peak memory is the annotation index (polygons held as
packed arrays, see :mod:`maskops.data.coco`) plus a few images: it does not grow with the
number or size of the images (bench/bench_data_pipeline.py: 53 MB for 1,000 images, 73 MB
for 5,000, workers 34 MB each for both). Shards hold contiguous runs of images in file
order; the training pipeline shuffles.

The conversion fails (:class:`DatasetError`) only when the JSON is malformed or nothing
usable remains; everything else is repaired or left out and reported.

Images without objects (no annotation, or none left after validation) are kept: training
sees them as negatives (every proposal is background), and the manifest counts them
(``num_images_without_objects``). ``drop_empty_images`` leaves them out instead, as TAO's
converter does; the manifest then counts them in ``num_dropped_empty_images``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from maskops.atomic import atomic_write
from maskops.data.coco import CocoAnnotation, CocoFile, CocoImage, DatasetError, load_coco
from maskops.data.convert_options import ConvertOptions
from maskops.data.labels import LabelMap
from maskops.data.manifest import MANIFEST_FORMAT, MANIFEST_VERSION, manifest_path
from maskops.data.ordered_pool import OrderedPool, worker_count
from maskops.data.shards import SHARD_NAME_RE, ShardWriter, file_sha256, shard_name
from maskops.data.validate import WARNING_KINDS, ImageOutcome, process_image

MIN_IMAGES_PER_SHARD = 16
"""TAO's 256 shards would leave a small set with one image per file; cap the count."""

ProgressFn = Callable[[int, int], None]
"""Called with (images done, images total) as the conversion advances."""


@dataclass(frozen=True)
class ConversionResult:
    tag: str
    out_dir: Path
    shards: tuple[Path, ...]
    manifest_path: Path
    warnings_path: Path
    label_map: LabelMap
    num_images: int
    """Images written."""
    num_skipped_images: int
    num_images_without_objects: int
    """Images written without any object (negatives)."""
    num_dropped_empty_images: int
    """Images without objects left out (``drop_empty_images``)."""
    num_annotations: int
    """Annotations written (crowd included)."""
    num_crowd: int
    num_dropped_annotations: int
    warning_counts: dict[str, int]
    """Kind -> number of findings of that kind (only kinds that occurred)."""
    category_counts: dict[int, int]
    """Category id -> instances written."""
    seconds: float

    def summary(self) -> str:
        """A one-screen report for the command line."""
        lines = [
            f"wrote {len(self.shards)} shard(s) {self.tag}-NNNNN-of-{len(self.shards):05d}.tar "
            f"to {self.out_dir} in {self.seconds:.1f}s",
            f"  images:      {self.num_images} written, {self.num_skipped_images} skipped; "
            + (
                f"{self.num_dropped_empty_images} without objects dropped"
                if self.num_dropped_empty_images
                else f"{self.num_images_without_objects} without objects (negatives)"
            ),
            f"  annotations: {self.num_annotations} written ({self.num_crowd} crowd), "
            f"{self.num_dropped_annotations} dropped",
            "  categories (id -> label name: instances):",
        ]
        shown = self.label_map.categories[:20]
        lines += [
            f"    {c.id:>6} -> {c.label:<3} {c.name}: {self.category_counts.get(c.id, 0)}"
            for c in shown
        ]
        if len(self.label_map) > len(shown):
            lines.append(f"    ... {len(self.label_map) - len(shown)} more in {self.manifest_path}")
        if self.warning_counts:
            lines.append(f"  findings ({self.warnings_path.name}):")
            lines += [f"    {kind:<20} {n}" for kind, n in self.warning_counts.items()]
        else:
            lines.append("  findings: none")
        return "\n".join(lines)


def convert_dataset(
    image_dir: Path | str,
    annotation_file: Path | str,
    out_dir: Path | str,
    options: ConvertOptions | None = None,
    *,
    progress: ProgressFn | None = None,
    extra_findings: dict[str, dict[str, list[Any]]] | None = None,
    source: dict[str, str] | None = None,
    **option_values: Any,
) -> ConversionResult:
    """Validate a COCO dataset and write it as shards, a manifest and a warnings file.

    Args:
        image_dir: directory the images' ``file_name`` entries are relative to.
        annotation_file: COCO instances JSON (polygons, RLE, crowd, any integer ids).
        out_dir: output directory (created). Earlier shards of the same tag are replaced.
        options: the tag, shards, masks, workers and empty images
            (:class:`~maskops.data.convert_options.ConvertOptions`; its ``format_name`` and
            ``labels`` are :func:`maskops.data.formats.convert_labelled_dataset`'s, this
            reads COCO); ``option_values`` (its field names) override single options.
        progress: optional callback ``(done, total)``.
        extra_findings: findings made before this conversion (reading another format,
            :mod:`maskops.data.formats`), merged into the warnings file by key.
        source: what the COCO file was converted from, added to the manifest's ``source``.

    Raises:
        DatasetError: malformed JSON (key and index named) or nothing usable remains.
    """
    start = time.monotonic()
    options = replace(options or ConvertOptions(), **option_values)
    image_dir, annotation_file, out_dir = Path(image_dir), Path(annotation_file), Path(out_dir)
    if options.num_shards < 1:
        raise DatasetError(f"num_shards must be >= 1, got {options.num_shards}")
    if not image_dir.is_dir():
        raise DatasetError(f"{image_dir}: image directory does not exist")
    tag = options.tag or annotation_file.stem
    if "/" in tag or not tag:
        raise DatasetError(f"tag {tag!r} must be a non-empty file name prefix")
    # The pool forks before the annotation index exists, so workers never hold a copy.
    with OrderedPool(worker_count(options.workers)) as pool:
        return _convert(
            image_dir,
            annotation_file,
            out_dir,
            tag,
            options.num_shards,
            options.include_masks,
            progress,
            pool,
            start,
            options.drop_empty_images,
            extra_findings or {},
            source or {},
        )


def _convert(
    image_dir: Path,
    annotation_file: Path,
    out_dir: Path,
    tag: str,
    num_shards: int,
    include_masks: bool,
    progress: ProgressFn | None,
    pool: OrderedPool,
    start: float,
    drop_empty_images: bool,
    extra_findings: dict[str, dict[str, list[Any]]],
    source: dict[str, str],
) -> ConversionResult:
    coco = load_coco(annotation_file)
    if not coco.images:
        raise DatasetError(f"{annotation_file.name}: images: empty")
    label_map = LabelMap.from_coco_categories(coco.categories)
    warnings = _initial_findings(coco, extra_findings)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_old_shards(out_dir, tag)
    labels = {c.id: c.label for c in label_map.categories}
    worker = partial(_process, image_dir=image_dir, labels=labels, include_masks=include_masks)
    tally = _Tally(drop_empty=drop_empty_images)
    shards = _write_shards(coco, out_dir, tag, num_shards, pool, worker, tally, warnings, progress)

    tally.dropped += sum(len(w.get("missing_image", [])) for w in warnings.values())
    warnings_file = out_dir / f"{tag}_warnings.json"
    warnings_file.write_text(json.dumps(warnings, indent=1))
    warning_counts = {
        kind: n
        for kind in WARNING_KINDS
        if (n := sum(len(entry.get(kind, [])) for entry in warnings.values()))
    }
    _fail_if_unusable(
        coco.annotations, tally, annotation_file, warning_counts, warnings_file, out_dir, tag
    )
    source = {
        "annotation_file": str(annotation_file.resolve()),
        "annotation_sha256": file_sha256(annotation_file),
        "image_dir": str(image_dir.resolve()),
    } | source
    manifest = _manifest(tag, source, include_masks, tally, label_map, shards, warnings_file)
    manifest["warning_counts"] = warning_counts
    path = manifest_path(out_dir, tag)
    atomic_write(path, json.dumps(manifest, indent=1))
    return ConversionResult(
        tag=tag,
        out_dir=out_dir,
        shards=tuple(out_dir / s["file"] for s in shards),
        manifest_path=path,
        warnings_path=warnings_file,
        label_map=label_map,
        num_images=tally.images,
        num_skipped_images=tally.skipped,
        num_images_without_objects=tally.empty,
        num_dropped_empty_images=tally.dropped_empty,
        num_annotations=tally.annotations,
        num_crowd=tally.crowd,
        num_dropped_annotations=tally.dropped,
        warning_counts=warning_counts,
        category_counts=dict(tally.instances),
        seconds=time.monotonic() - start,
    )


def _initial_findings(
    coco: CocoFile, extra_findings: dict[str, dict[str, list[Any]]]
) -> dict[str, dict[str, list[Any]]]:
    """Findings before any image is read: annotations of images the file does not list,
    and those made while reading another format."""
    warnings: dict[str, dict[str, list[Any]]] = {}
    known_ids = {image.id for image in coco.images}
    for image_id, anns in coco.annotations_by_image.items():
        if image_id not in known_ids:
            warnings[str(image_id)] = {"box": [], "mask": [], "missing_image": [a.id for a in anns]}
    for key, found in extra_findings.items():
        entry = warnings.setdefault(key, {"box": [], "mask": []})
        for kind, items in found.items():
            entry.setdefault(kind, []).extend(items)
    return warnings


def _write_shards(
    coco: CocoFile,
    out_dir: Path,
    tag: str,
    num_shards: int,
    pool: OrderedPool,
    worker: Callable[[tuple[CocoImage, list[CocoAnnotation]]], ImageOutcome],
    tally: _Tally,
    warnings: dict[str, dict[str, list[Any]]],
    progress: ProgressFn | None,
) -> list[dict[str, Any]]:
    """Check every image in ``pool`` and write the kept ones to the shards, in the file's
    order; returns the shards' manifest entries. On any failure no shard of ``tag`` is
    left behind."""
    count = max(1, min(num_shards, len(coco.images) // MIN_IMAGES_PER_SHARD))
    jobs = [(image, coco.annotations_by_image.get(image.id, [])) for image in coco.images]
    sink = _ShardSink(out_dir, tag, count)
    try:
        for position, outcome in enumerate(pool.map(worker, jobs)):
            _record_findings(warnings, outcome)
            keep = tally.add(outcome)
            if keep and outcome.record is not None:
                sink.write(position * count // len(jobs), f"{position:09d}", outcome)
            if progress is not None:
                progress(position + 1, len(jobs))
        return sink.close()
    except BaseException:
        sink.abort()
        _remove_old_shards(out_dir, tag)
        raise


def _manifest(
    tag: str,
    source: dict[str, str],
    include_masks: bool,
    tally: _Tally,
    label_map: LabelMap,
    shards: list[dict[str, Any]],
    warnings_file: Path,
) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "tag": tag,
        "source": source,
        "include_masks": include_masks,
        "num_images": tally.images,
        "num_skipped_images": tally.skipped,
        "num_images_without_objects": tally.empty,
        "num_dropped_empty_images": tally.dropped_empty,
        "num_annotations": tally.annotations,
        "num_crowd": tally.crowd,
        "num_dropped_annotations": tally.dropped,
        "label_map": label_map.to_json(),
        "categories": [
            {
                "id": c.id,
                "name": c.name,
                "label": c.label,
                "instances": tally.instances.get(c.id, 0),
                "images": tally.images_with.get(c.id, 0),
            }
            for c in label_map.categories
        ],
        "shards": shards,
        "warnings_file": warnings_file.name,
    }


def _process(
    job: tuple[CocoImage, list[CocoAnnotation]],
    *,
    image_dir: Path,
    labels: dict[int, int],
    include_masks: bool,
) -> ImageOutcome:
    image, annotations = job
    try:
        return process_image(
            image, annotations, image_dir=image_dir, labels=labels, include_masks=include_masks
        )
    except Exception as exc:  # one image must never end a long conversion
        outcome = ImageOutcome(image.id, dropped_annotations=len(annotations))
        outcome.note("error", f"{image.file_name}: {type(exc).__name__}: {exc}")
        return outcome


@dataclass
class _Tally:
    """Running counts of a conversion."""

    drop_empty: bool = False
    images: int = 0
    skipped: int = 0
    empty: int = 0
    """Images written without objects."""
    dropped_empty: int = 0
    annotations: int = 0
    crowd: int = 0
    dropped: int = 0
    instances: dict[int, int] = field(default_factory=dict)
    """Category id -> instances written."""
    images_with: dict[int, int] = field(default_factory=dict)
    """Category id -> images written with at least one instance of it."""

    def add(self, outcome: ImageOutcome) -> bool:
        """Count an outcome; False for an image without objects that is to be dropped."""
        self.dropped += outcome.dropped_annotations
        if outcome.record is None:
            self.skipped += 1
            return True
        anns = outcome.record["annotations"]
        if not anns:
            if self.drop_empty:
                self.dropped_empty += 1
                return False
            self.empty += 1
        self.images += 1
        self.annotations += len(anns)
        self.crowd += sum(a["iscrowd"] for a in anns)
        for ann in anns:
            self.instances[ann["category_id"]] = self.instances.get(ann["category_id"], 0) + 1
        for category_id in {a["category_id"] for a in anns}:
            self.images_with[category_id] = self.images_with.get(category_id, 0) + 1
        return True


class _ShardSink:
    """Writes samples into shard ``index`` of ``count``, one open shard at a time."""

    def __init__(self, out_dir: Path, tag: str, count: int) -> None:
        self.out_dir, self.tag, self.count = out_dir, tag, count
        self._writer: ShardWriter | None = None
        self._index = -1
        self.shards: list[dict[str, Any]] = []

    def write(self, index: int, key: str, outcome: ImageOutcome) -> None:
        assert outcome.record is not None
        # Shards hold contiguous runs, so the index only grows; every index up to it gets
        # its file, even one whose images were all skipped.
        while self._index < index:
            self._next()
        assert self._writer is not None
        self._writer.write(key, outcome.record, outcome.image_bytes, outcome.image_format)

    def _next(self) -> None:
        self._finish()
        self._index += 1
        path = self.out_dir / shard_name(self.tag, self._index, self.count)
        self._writer = ShardWriter(path)

    def _finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self.shards.append(
                {
                    "file": self._writer.path.name,
                    "num_samples": self._writer.num_samples,
                    "sha256": file_sha256(self._writer.path),
                }
            )
            self._writer = None

    def close(self) -> list[dict[str, Any]]:
        """Finish the open shard and write any trailing (empty) ones; the shard list."""
        while self._index < self.count - 1:
            self._next()
        self._finish()
        return self.shards

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
            self._writer = None


def _record_findings(warnings: dict[str, dict[str, list[Any]]], outcome: ImageOutcome) -> None:
    if not outcome.findings:
        return
    # TAO's warnings file always carries "box" and "mask" for an image it lists.
    entry = warnings.setdefault(str(outcome.image_id), {"box": [], "mask": []})
    for kind, items in outcome.findings.items():
        entry.setdefault(kind, []).extend(items)


def _fail_if_unusable(
    annotations: list[CocoAnnotation],
    tally: _Tally,
    annotation_file: Path,
    warning_counts: dict[str, int],
    warnings_file: Path,
    out_dir: Path,
    tag: str,
) -> None:
    reasons = ", ".join(f"{kind} {n}" for kind, n in warning_counts.items()) or "none"
    message = ""
    if tally.images == 0 and tally.dropped_empty:
        message = f"no image with objects: {tally.dropped_empty} dropped as empty"
    elif tally.images == 0:
        message = f"no usable image: all {tally.skipped} were skipped"
    elif annotations and tally.annotations == 0:
        message = f"no usable annotation: all {len(annotations)} were dropped"
        if warning_counts.get("empty_mask"):
            message += " (no masks? convert with --no-include_mask for boxes only)"
    if message:
        _remove_old_shards(out_dir, tag)
        raise DatasetError(
            f"{annotation_file.name}: {message}; findings: {reasons}; see {warnings_file}"
        )


def _remove_old_shards(out_dir: Path, tag: str) -> None:
    for path in out_dir.iterdir():
        match = SHARD_NAME_RE.match(path.name.removesuffix(".partial"))
        if match and match["tag"] == tag:
            path.unlink()
    manifest_path(out_dir, tag).unlink(missing_ok=True)
