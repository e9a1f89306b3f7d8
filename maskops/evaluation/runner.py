"""Evaluation entry points: a model over a loader (``evaluate_model``) and the whole
``maskops evaluate`` job (``run_evaluation``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from maskops.atomic import atomic_write
from maskops.device import select_device
from maskops.evaluation.coco import IouType
from maskops.evaluation.errors import EvaluationError
from maskops.evaluation.evaluator import COCOEvaluator
from maskops.evaluation.options import EvaluateOptions
from maskops.evaluation.predictor import (
    Predictor,
    TorchPredictor,
    check_input_size,
    load_predictor,
)
from maskops.progress import progress_bar, shown
from maskops.spec.models import ExperimentSpec

Batch = tuple[Sequence[torch.Tensor], Sequence[Mapping[str, Any]]]
"""``(images, targets)`` as ``maskops.data.pipeline.build_eval_loader`` yields them."""


def evaluate_model(
    model: torch.nn.Module | Predictor,
    loader: Iterable[Batch],
    evaluator: COCOEvaluator,
    *,
    max_images: int | None = None,
    progress: bool = False,
    desc: str = "evaluate",
) -> dict[str, float]:
    """Run a model over evaluation batches and return the evaluator's COCO metrics.

    Args:
        model: an eager Mask R-CNN (run in eval mode, its mode restored afterwards) or any
            :class:`~maskops.evaluation.predictor.Predictor`.
        loader: batches ``(images, targets)``: images float32 ``[3, H, W]`` resized and
            padded; targets with ``image_id``, ``scale``, ``orig_size``.
        evaluator: reset here, then fed every batch.
        max_images: stop after this many images (None = all the loader yields).
        progress: show progress: a bar on a terminal, plain lines elsewhere.
        desc: the progress's name (``evaluate: 4/8 img ...``).

    Returns:
        ``{metric name: value}`` (see :class:`COCOEvaluator`).
    """
    predictor: Predictor = TorchPredictor(model) if isinstance(model, torch.nn.Module) else model
    evaluator.reset()
    seen = 0
    bar = progress_bar(max_images, desc=desc, unit="img", enabled=shown(progress))
    with closing(bar):
        for images, targets in loader:
            if max_images is not None:
                room = max_images - seen
                if room <= 0:
                    break
                images, targets = images[:room], targets[:room]
            outputs = predictor(list(images))
            evaluator.process(targets, outputs)
            seen += len(images)
            bar.update(len(images))
    return evaluator.evaluate()


def format_metrics(metrics: Mapping[str, float]) -> str:
    """A fixed-width table of metrics, one per line, in the order given."""
    width = max((len(k) for k in metrics), default=0)
    return "\n".join(f"{name:<{width}}  {value:.6f}" for name, value in metrics.items())


def format_per_class(rows: Sequence[Mapping[str, Any]]) -> str:
    """Per-category AP as a table: id, name, AP and (with masks) mask AP."""
    keys = [k for k in ("AP", "mask_AP") if rows and k in rows[0]]
    width = max([len(str(r["name"])) for r in rows] + [8])
    lines = [f"{'id':>5}  {'category':<{width}}  " + "  ".join(f"{k:>9}" for k in keys)]
    for row in rows:
        values = "  ".join(f"{row[k]:>9.6f}" for k in keys)
        lines.append(f"{row['category_id']:>5}  {row['name']:<{width}}  {values}")
    return "\n".join(lines)


def check_eval_data(spec: ExperimentSpec, *, image_dir: Path | None = None) -> None:
    """Fail early, naming the field, when the spec cannot drive an evaluation."""
    data = spec.data_config
    if not data.validation_file_pattern and image_dir is None:
        raise EvaluationError(
            "data_config.validation_file_pattern is not set (nor -i/--image_dir, the "
            "directory of val_json_file's images)"
        )
    if not data.val_json_file:
        raise EvaluationError("data_config.val_json_file is not set")
    if not Path(data.val_json_file).is_file():
        raise EvaluationError(f"data_config.val_json_file: {data.val_json_file} does not exist")
    if spec.eval_batch_size < 1:
        raise EvaluationError(f"eval_batch_size must be at least 1, got {spec.eval_batch_size}")


def image_dir_batches(
    spec: ExperimentSpec, image_dir: Path, *, batch_size: int | None = None
) -> Iterator[Batch]:
    """Evaluation batches read from ``image_dir``: the images ``val_json_file`` lists (its
    ``file_name`` relative to ``image_dir``), in its order, the first ``eval_samples`` only
    when that is > 0. Images are float ``[3, H, W]`` resized and padded to ``image_size``;
    targets carry ``image_id``, ``scale`` and ``orig_size`` like the shard loader's.

    Raises:
        EvaluationError: an image the JSON lists is missing or unreadable.
    """
    from maskops.data.transforms import resize_and_pad
    from maskops.evaluation.errors import ImageReadError
    from maskops.evaluation.images import load_rgb, pil_to_tensor

    data = spec.data_config
    listed = json.loads(Path(data.val_json_file).read_text()).get("images", [])
    if data.eval_samples > 0:
        listed = listed[: data.eval_samples]
    size = batch_size or spec.eval_batch_size
    for start in range(0, len(listed), size):
        images: list[torch.Tensor] = []
        targets: list[dict[str, Any]] = []
        for entry in listed[start : start + size]:
            try:
                image = load_rgb(image_dir / str(entry["file_name"]))
            except ImageReadError as exc:
                raise EvaluationError(f"-i {image_dir}: {exc}") from None
            tensor, scale = resize_and_pad(pil_to_tensor(image), data.image_size, keep_uint8=True)
            images.append(tensor)
            targets.append(
                {"image_id": int(entry["id"]), "scale": scale, "orig_size": image.size[::-1]}
            )
        yield images, targets


def run_evaluation(
    spec: ExperimentSpec,
    model_path: str | Path,
    options: EvaluateOptions | None = None,
    *,
    out_json: Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    **option_values: Any,
) -> dict[str, float]:
    """Evaluate a model file on the spec's validation data (``maskops evaluate``).

    The architecture, label map and ``include_mask`` come from the model file; the data
    (``validation_file_pattern``, ``val_json_file``, ``eval_samples``, ``eval_batch_size``,
    ``image_size``) from ``spec``, whose paths must already be resolved.

    Args:
        spec: the experiment spec.
        model_path: a maskops checkpoint, or an exported model a loader is registered for.
        options: the device and images (:class:`~maskops.evaluation.options.EvaluateOptions`);
            ``option_values`` (its field names) override single options.
        out_json: where to write ``{"metrics": ..., ...}``; None writes nothing.
        progress: show progress: a bar on a terminal, plain lines elsewhere.
        log: receives the human-readable lines (the metrics table at the end).

    Returns:
        The metrics: 24 (boxes and masks) or 12 (``include_mask: false``).
    """
    from maskops.data.pipeline import build_eval_loader

    options = replace(options or EvaluateOptions(), **option_values)
    image_dir = options.image_dir
    check_eval_data(spec, image_dir=image_dir)
    started = time.perf_counter()
    loaded = load_predictor(model_path, device=select_device(options.gpu_index))
    check_input_size(loaded, spec.data_config.image_size)
    iou_types: tuple[IouType, ...] = ("bbox", "segm") if loaded.include_mask else ("bbox",)
    evaluator = COCOEvaluator(spec.data_config.val_json_file, loaded.label_map, iou_types=iou_types)
    # The loader keeps the first eval_samples images; the ground truth comes from
    # val_json_file, so the shards' masks need not be decoded.
    loader: Iterable[Batch]
    if spec.data_config.validation_file_pattern:
        image_dir = None  # the shards hold the images
    if image_dir is not None:
        loader = image_dir_batches(spec, image_dir)
    else:
        try:
            loader = build_eval_loader(spec, label_map=loaded.label_map, with_masks=False)
        except ValueError as exc:  # no shards, unreadable manifests, categories the model lacks
            raise EvaluationError(f"data_config.validation_file_pattern: {exc}") from None
    # The loaders already stop at eval_samples: as max_images it gives the bar its total.
    total = spec.data_config.eval_samples or None
    metrics = evaluate_model(
        loaded.predictor, loader, evaluator, max_images=total, progress=progress
    )
    seconds = time.perf_counter() - started
    log(f"Evaluated {len(evaluator.image_ids)} images in {seconds:.1f} s")
    log(format_metrics(metrics))
    per_class = evaluator.per_class()
    log("Per-class AP (-1: no object of that class in the evaluated images)")
    log(format_per_class(per_class))
    if out_json is not None:
        report = {
            "metrics": metrics,
            "per_class": per_class,
            "model": str(model_path),
            "val_json_file": spec.data_config.val_json_file,
            "validation_file_pattern": spec.data_config.validation_file_pattern,
            "image_dir": str(image_dir) if image_dir is not None else None,
            "num_images": len(evaluator.image_ids),
            "num_detections": len(evaluator.results),
            "seconds": round(seconds, 3),
        }
        out_json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out_json, json.dumps(report, indent=2) + "\n")
        log(f"Metrics written to {out_json}")
    return metrics
