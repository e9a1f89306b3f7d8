"""``maskops inference``: detect on a directory of images, draw and save the results."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from tqdm import tqdm

from maskops.atomic import atomic_path, atomic_write
from maskops.data.labels import LabelMap
from maskops.data.transforms import resize_and_pad
from maskops.device import select_device
from maskops.evaluation.errors import EvaluationError, ImageReadError
from maskops.evaluation.images import list_images, load_rgb, pil_to_tensor
from maskops.evaluation.inference_options import InferenceOptions
from maskops.evaluation.postprocess import detections_to_coco
from maskops.evaluation.predictor import LoadedPredictor, check_input_size, load_predictor
from maskops.evaluation.visualize import draw_detections
from maskops.progress import progress_bar, shown
from maskops.spec.models import ExperimentSpec

IMAGES_INDEX = "coco_images.json"
"""Written next to the per-image results: a COCO skeleton (images, categories) that
``pycocotools.coco.COCO(...).loadRes`` accepts the results against."""


@dataclass
class InferenceSummary:
    images: int = 0
    detections: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    seconds: float = 0.0


def annotated_image_ids(path: Path) -> dict[str, int]:
    """``file_name -> id`` of a COCO JSON's images, also keyed by the base name where no
    other image shares it (an image directory holds base names; ``file_name`` may be a
    relative path).

    Raises:
        EvaluationError: unreadable or not a COCO file.
    """
    try:
        images = json.loads(path.read_text())["images"]
        pairs = [(str(image["file_name"]), int(image["id"])) for image in images]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EvaluationError(f"{path}: not a readable COCO annotation file ({exc})") from None
    ids = dict(pairs)
    bases = Counter(Path(name).name for name, _ in pairs)
    for name, image_id in pairs:
        if bases[Path(name).name] == 1:
            ids.setdefault(Path(name).name, image_id)
    return ids


def name_image_id(name: str) -> int:
    """A stable id derived from a file name alone: its stem when that is a number (COCO
    names its files ``000000397133.jpg``), else 52 bits of the name's SHA-1 (exact in
    JSON readers that use doubles)."""
    stem = Path(name).stem
    if stem.isdigit() and int(stem) < 2**52:
        return int(stem)
    return _hash_id(name)


def _hash_id(text: str) -> int:
    return int(hashlib.sha1(text.encode()).hexdigest()[:13], 16)


def assign_image_ids(paths: Sequence[Path], known: Mapping[str, int] | None = None) -> list[int]:
    """Image ids for inference results, independent of which other files are present.

    An image ``known`` lists by file name (an annotation file's ``file_name -> id``) gets
    that id, so the results score against that file; any other image gets
    :func:`name_image_id` of its name. A derived id that an annotated image already uses
    (or, vanishingly rarely, another derived id) is replaced by the hash of the name with
    ``#`` appended (again, until it is free).
    """
    known = known or {}
    ids: list[int | None] = [known.get(p.name) for p in paths]
    used = {i for i in ids if i is not None}
    for index, path in enumerate(paths):
        if ids[index] is not None:
            continue
        name, candidate = path.name, name_image_id(path.name)
        while candidate in used:
            name += "#"
            candidate = _hash_id(name)
        ids[index] = candidate
        used.add(candidate)
    return [int(i) for i in ids if i is not None]


def _label_names(paths: Sequence[Path]) -> list[str]:
    """``<stem>.json`` per image, ``<name>.json`` where two images share a stem."""
    stems = [p.stem for p in paths]
    return [f"{p.stem if stems.count(p.stem) == 1 else p.name}.json" for p in paths]


def _save_image(image: Image.Image, path: Path) -> None:
    with atomic_path(path) as tmp:
        if path.suffix.lower() in (".jpg", ".jpeg"):
            image.save(tmp, format="JPEG", quality=95)
        else:
            image.save(tmp, format="PNG")


def _write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data) + "\n")


def _stderr(message: str) -> None:
    tqdm.write(message, file=sys.stderr)


def _known_ids(
    spec: ExperimentSpec, annotations: Path | None, log: Callable[[str], None]
) -> dict[str, int]:
    if annotations is None and spec.data_config.val_json_file:
        candidate = Path(spec.data_config.val_json_file)
        annotations = candidate if candidate.is_file() else None
    if annotations is None:
        return {}
    known = annotated_image_ids(annotations)
    log(f"Image ids: from {annotations} for the images it lists, else from file names")
    return known


def category_names(
    label_map: LabelMap, class_names: Mapping[int, str] | None = None
) -> dict[int, str]:
    """Dataset category id -> display name: the label map's, or ``class_names`` (model
    class index 1..K -> name) where it names that class."""
    names = {c.id: c.name for c in label_map.categories}
    for index, name in (class_names or {}).items():
        if 1 <= index <= len(label_map.categories):
            names[label_map.category_id_of(index)] = name
    return names


def read_class_map(path: Path) -> dict[int, str]:
    """TAO's inference ``-c`` label file: one class name per line, line ``k`` (1-based)
    naming model class ``k``; blank lines keep their class's own name.

    Raises:
        EvaluationError: unreadable file.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvaluationError(f"-c {path}: {exc.strerror or exc}") from None
    return {k: line.strip() for k, line in enumerate(lines, start=1) if line.strip()}


def run_inference(
    spec: ExperimentSpec,
    model_path: str | Path,
    image_dir: Path,
    out_image_dir: Path,
    options: InferenceOptions | None = None,
    *,
    label_dir: Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    warn: Callable[[str], None] = _stderr,
    loaded: LoadedPredictor | None = None,
    class_names: Mapping[int, str] | None = None,
    **option_values: Any,
) -> InferenceSummary:
    """Detect objects in every JPEG/PNG of ``image_dir`` and write annotated copies.

    Images are read upright (EXIF orientation applied) as RGB, resized and padded to the
    spec's ``image_size`` and run ``eval_batch_size`` at a time. Unreadable files (and
    files that are not JPEG/PNG) are reported through ``warn`` and skipped.

    Args:
        spec: supplies ``data_config.image_size`` and ``eval_batch_size``.
        model_path: a maskops checkpoint (or a registered exported format).
        image_dir: the input images (not searched recursively).
        out_image_dir: annotated images, same file names and formats as the inputs.
        options: the score threshold, masks, device and image ids
            (:class:`~maskops.evaluation.inference_options.InferenceOptions`; the ids come
            from its ``annotations``, see :func:`assign_image_ids`); ``option_values`` (its
            field names) override single options.
        label_dir: if given, one COCO results JSON per image (``<stem>.json``: a list of
            ``image_id``, ``file_name``, ``category_id``, ``bbox`` ``[x, y, w, h]``,
            ``score`` and, for models with masks, ``segmentation`` RLE), plus
            :data:`IMAGES_INDEX`.
        progress: show progress: a bar on a terminal, plain lines elsewhere.
        log, warn: receive progress lines and per-file problems.
        loaded: an already opened model (then ``model_path`` is only used in messages).
        class_names: model class index (1..K, the order of the label map) -> the name to
            draw and write (TAO's ``-c`` class map); default: the label map's names.

    Returns:
        Counts and the skipped files with reasons.
    """
    options = replace(options or InferenceOptions(), **option_values)
    started = time.perf_counter()
    _check_inputs(spec, image_dir, out_image_dir)
    summary = InferenceSummary()
    paths = _images_of(image_dir, summary, warn)
    if loaded is None:
        loaded = load_predictor(model_path, device=select_device(options.gpu_index))
    check_input_size(loaded, spec.data_config.image_size)
    if options.include_mask and not loaded.include_mask:
        warn(f"{model_path} predicts no masks (include_mask is off in its spec); drawing boxes")
    out_image_dir.mkdir(parents=True, exist_ok=True)
    writer = _ResultWriter(
        paths=paths,
        image_ids=assign_image_ids(paths, _known_ids(spec, options.annotations, log)),
        label_names=_label_names(paths),
        names=category_names(loaded.label_map, class_names),
        out_image_dir=out_image_dir,
        label_dir=label_dir,
        include_mask=options.include_mask,
        summary=summary,
    )
    bar = progress_bar(len(paths), desc="inference", unit="img", enabled=shown(progress))
    with closing(bar):
        for start in range(0, len(paths), spec.eval_batch_size):
            indices = range(start, min(start + spec.eval_batch_size, len(paths)))
            _infer_batch(loaded, spec, options.threshold, indices, writer, warn)
            bar.update(len(indices))
    writer.finish()
    summary.seconds = time.perf_counter() - started
    log(writer.report())
    return summary


def _infer_batch(
    loaded: LoadedPredictor,
    spec: ExperimentSpec,
    threshold: float,
    indices: range,
    writer: _ResultWriter,
    warn: Callable[[str], None],
) -> None:
    """Detect objects in the readable images of ``indices`` in one batch and write them."""
    image_size = spec.data_config.image_size
    batch, inputs = _read_batch(writer.paths, indices, image_size, writer.summary, warn)
    outputs = loaded.predictor(inputs) if inputs else []
    for (index, image, scale), output in zip(batch, outputs, strict=True):
        detections = detections_to_coco(
            output,
            image_id=writer.image_ids[index],
            scale=scale,
            orig_hw=(image.height, image.width),
            label_map=loaded.label_map,
            score_threshold=threshold,
        )
        writer.write(index, image, detections)


def _images_of(
    image_dir: Path, summary: InferenceSummary, warn: Callable[[str], None]
) -> list[Path]:
    """The JPEG/PNG files of ``image_dir``; the other files are reported as skipped."""
    paths, others = list_images(image_dir)
    for other in others:
        summary.skipped.append((other, "not a .jpg/.jpeg/.png file"))
        warn(f"skipped {other}: not a .jpg/.jpeg/.png file")
    return list(paths)


def _check_inputs(spec: ExperimentSpec, image_dir: Path, out_image_dir: Path) -> None:
    if not image_dir.is_dir():
        raise EvaluationError(f"-i {image_dir}: not a directory")
    if out_image_dir.resolve() == image_dir.resolve():
        raise EvaluationError("the output image directory must differ from the input directory")
    if spec.eval_batch_size < 1:
        raise EvaluationError(f"eval_batch_size must be at least 1, got {spec.eval_batch_size}")


def _read_batch(
    paths: Sequence[Path],
    indices: range,
    image_size: tuple[int, int],
    summary: InferenceSummary,
    warn: Callable[[str], None],
) -> tuple[list[tuple[int, Image.Image, float]], list[torch.Tensor]]:
    """The readable images of ``indices``: ``(index, upright RGB image, scale)`` and the
    network inputs (``[3, H, W]`` uint8, resized and padded; the predictor divides them);
    unreadable ones are reported and skipped."""
    batch: list[tuple[int, Image.Image, float]] = []
    inputs: list[torch.Tensor] = []
    for index in indices:
        try:
            image = load_rgb(paths[index])
        except ImageReadError as exc:
            summary.skipped.append((paths[index], str(exc)))
            warn(f"skipped {exc}")
            continue
        tensor, scale = resize_and_pad(pil_to_tensor(image), image_size, keep_uint8=True)
        batch.append((index, image, scale))
        inputs.append(tensor)
    return batch, inputs


@dataclass
class _ResultWriter:
    """Writes each image's annotated copy and, with ``label_dir``, its COCO results and
    finally :data:`IMAGES_INDEX`; counts into ``summary``."""

    paths: Sequence[Path]
    image_ids: Sequence[int]
    label_names: Sequence[str]
    names: dict[int, str]
    out_image_dir: Path
    label_dir: Path | None
    include_mask: bool
    summary: InferenceSummary
    index_images: list[dict[str, Any]] = field(default_factory=list)

    def write(self, index: int, image: Image.Image, detections: list[dict[str, Any]]) -> None:
        path = self.paths[index]
        for detection in detections:
            detection["file_name"] = path.name
        annotated = draw_detections(
            image, detections, category_names=self.names, include_mask=self.include_mask
        )
        _save_image(annotated, self.out_image_dir / path.name)
        if self.label_dir is not None:
            self.label_dir.mkdir(parents=True, exist_ok=True)
            _write_json(self.label_dir / self.label_names[index], detections)
        self.index_images.append(
            {
                "id": self.image_ids[index],
                "file_name": path.name,
                "height": image.height,
                "width": image.width,
            }
        )
        self.summary.images += 1
        self.summary.detections += len(detections)

    def report(self) -> str:
        """The run in one line: counts, time, where the results are."""
        summary = self.summary
        return (
            f"Annotated {summary.images} image(s) with {summary.detections} detection(s) "
            f"in {summary.seconds:.1f} s; skipped {len(summary.skipped)}; images in "
            f"{self.out_image_dir}"
            + (f", results in {self.label_dir}" if self.label_dir is not None else "")
        )

    def finish(self) -> None:
        if self.label_dir is None:
            return
        self.label_dir.mkdir(parents=True, exist_ok=True)
        _write_json(
            self.label_dir / IMAGES_INDEX,
            {
                "images": self.index_images,
                "categories": [{"id": i, "name": n} for i, n in self.names.items()],
                "annotations": [],
            },
        )
