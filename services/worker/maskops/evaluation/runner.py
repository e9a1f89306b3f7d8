"""Evaluation entry points: a model over a loader (``evaluate_model``) and the whole
``maskops evaluate`` job (``run_evaluation``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from maskops.evaluation.coco import IouType
from maskops.evaluation.errors import EvaluationError
from maskops.evaluation.evaluator import COCOEvaluator
from maskops.evaluation.predictor import (
    Predictor,
    TorchPredictor,
    check_input_size,
    load_predictor,
)
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
) -> dict[str, float]:
    """Run a model over evaluation batches and return the evaluator's COCO metrics.

    Args:
        model: an eager Mask R-CNN (run in eval mode, its mode restored afterwards) or any
            :class:`~maskops.evaluation.predictor.Predictor`.
        loader: batches ``(images, targets)``: images float32 ``[3, H, W]`` resized and
            padded; targets with ``image_id``, ``scale``, ``orig_size``.
        evaluator: reset here, then fed every batch.
        max_images: stop after this many images (None = all the loader yields).
        progress: show a progress bar.

    Returns:
        ``{metric name: value}`` (see :class:`COCOEvaluator`).
    """
    predictor: Predictor = TorchPredictor(model) if isinstance(model, torch.nn.Module) else model
    evaluator.reset()
    seen = 0
    with tqdm(total=max_images, unit="img", disable=not progress, desc="evaluate") as bar:
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


def select_device(gpu_index: int | None) -> torch.device:
    if gpu_index is None or not torch.cuda.is_available():
        return torch.device("cpu")
    if not 0 <= gpu_index < torch.cuda.device_count():
        raise EvaluationError(
            f"--gpu_index {gpu_index} is out of range: {torch.cuda.device_count()} GPU(s) present"
        )
    return torch.device("cuda", gpu_index)


def check_eval_data(spec: ExperimentSpec) -> None:
    """Fail early, naming the field, when the spec cannot drive an evaluation."""
    data = spec.data_config
    if not data.validation_file_pattern:
        raise EvaluationError("data_config.validation_file_pattern is not set")
    if not data.val_json_file:
        raise EvaluationError("data_config.val_json_file is not set")
    if not Path(data.val_json_file).is_file():
        raise EvaluationError(f"data_config.val_json_file: {data.val_json_file} does not exist")
    if spec.eval_batch_size < 1:
        raise EvaluationError(f"eval_batch_size must be at least 1, got {spec.eval_batch_size}")


def run_evaluation(
    spec: ExperimentSpec,
    model_path: str | Path,
    *,
    out_json: Path | None = None,
    gpu_index: int | None = 0,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """Evaluate a model file on the spec's validation data (``maskops evaluate``).

    The architecture, label map and ``include_mask`` come from the model file; the data
    (``validation_file_pattern``, ``val_json_file``, ``eval_samples``, ``eval_batch_size``,
    ``image_size``) from ``spec``, whose paths must already be resolved.

    Args:
        spec: the experiment spec.
        model_path: a maskops checkpoint, or an exported model a loader is registered for.
        out_json: where to write ``{"metrics": ..., ...}``; None writes nothing.
        gpu_index: CUDA device to use when CUDA is available; CPU otherwise.
        progress: show a progress bar.
        log: receives the human-readable lines (the metrics table at the end).

    Returns:
        The metrics: 24 (boxes and masks) or 12 (``include_mask: false``).
    """
    from maskops.data.pipeline import build_eval_loader

    check_eval_data(spec)
    started = time.perf_counter()
    loaded = load_predictor(model_path, device=select_device(gpu_index))
    check_input_size(loaded, spec.data_config.image_size)
    iou_types: tuple[IouType, ...] = ("bbox", "segm") if loaded.include_mask else ("bbox",)
    evaluator = COCOEvaluator(spec.data_config.val_json_file, loaded.label_map, iou_types=iou_types)
    # The loader keeps the first eval_samples images; the ground truth comes from
    # val_json_file, so the shards' masks need not be decoded.
    try:
        loader = build_eval_loader(spec, label_map=loaded.label_map, with_masks=False)
    except ValueError as exc:  # no shards, unreadable manifests, categories the model lacks
        raise EvaluationError(f"data_config.validation_file_pattern: {exc}") from None
    metrics = evaluate_model(loaded.predictor, loader, evaluator, progress=progress)
    seconds = time.perf_counter() - started
    log(f"Evaluated {len(evaluator.image_ids)} images in {seconds:.1f} s")
    log(format_metrics(metrics))
    if out_json is not None:
        report = {
            "metrics": metrics,
            "model": str(model_path),
            "val_json_file": spec.data_config.val_json_file,
            "validation_file_pattern": spec.data_config.validation_file_pattern,
            "num_images": len(evaluator.image_ids),
            "num_detections": len(evaluator.results),
            "seconds": round(seconds, 3),
        }
        out_json.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_json.with_name(f".{out_json.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(out_json)
        log(f"Metrics written to {out_json}")
    return metrics
