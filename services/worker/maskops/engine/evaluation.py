"""The periodic evaluation of a training run, sharded across its ranks.

Each rank evaluates its own slice of the validation set: the evaluation loader of rank
``r`` of ``W`` takes samples ``r, r + W, ...``, so every image is evaluated exactly once
and the slices differ by at most one image when ``W`` does not divide their number. The
ranks then meet on the :class:`~maskops.engine.distributed.EvalGroup` (gloo, a long
timeout): rank 0 gathers every image's COCO results and every rank's validation-loss sums,
computes the metrics (the same as a one-rank evaluation of the same weights: same
detections, evaluated in image id order) and broadcasts them, so that all ranks leave the
evaluation together and with the same figures. A rank waits for its peers as long as the
slowest shard takes, then for rank 0's COCO computation; never on the training group.

Every rank builds its evaluation function at the same point and calls it at the same steps
(:class:`~maskops.engine.hooks.EvalHook` on every rank).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn

from maskops.data.labels import LabelMap
from maskops.engine.distributed import EvalGroup, RankInfo
from maskops.engine.hooks import PER_CLASS_KEYS, EvalFn
from maskops.engine.trainer import AmpSettings
from maskops.engine.validation import mean_losses, validation_loss_sums
from maskops.evaluation.evaluator import COCOEvaluator
from maskops.evaluation.predictor import Predictor
from maskops.evaluation.runner import Batch
from maskops.spec.models import ExperimentSpec

logger = logging.getLogger("maskops.train")


def sharded_coco_metrics(
    predictor: Predictor,
    loader: Iterable[Batch],
    evaluator: COCOEvaluator,
    group: EvalGroup,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """COCO metrics and per-class rows of all ranks' images, on every rank.

    ``loader`` yields this rank's slice; ``evaluator`` converts its outputs to COCO results
    here, and on rank 0 evaluates the union of every rank's (an image in two slices is an
    :class:`~maskops.evaluation.errors.EvaluationError`).
    """
    evaluator.reset()
    for images, targets in loader:
        evaluator.process(targets, predictor(list(images)))
    states = group.gather(evaluator.state())
    figures: tuple[dict[str, float], list[dict[str, Any]]] = ({}, [])
    if group.is_main:
        evaluator.load(states)
        figures = (evaluator.evaluate(), evaluator.per_class())
    return group.broadcast(figures)


def sharded_validation_loss(
    model: nn.Module, loader: Iterable[Any], info: RankInfo, amp: AmpSettings, group: EvalGroup
) -> dict[str, float]:
    """Mean validation losses per batch over every rank's batches, on every rank."""
    sums = validation_loss_sums(model, loader, device=info.device, amp=amp)
    parts = group.gather(sums)
    return group.broadcast(mean_losses(parts) if group.is_main else {})


def loss_eval_fn(
    spec: ExperimentSpec, info: RankInfo, amp: AmpSettings, label_map: LabelMap, group: EvalGroup
) -> EvalFn:
    """The validation losses (``val/<TAO loss name>``, ``val/Total loss``)."""
    from maskops.data.pipeline import build_eval_loader

    def evaluate(model: nn.Module, step: int) -> dict[str, float]:
        loader = build_eval_loader(
            spec, label_map=label_map, rank=info.rank, world_size=info.world_size
        )
        return sharded_validation_loss(model, loader, info, amp, group)

    return evaluate


def coco_eval_fn(
    spec: ExperimentSpec, info: RankInfo, amp: AmpSettings, label_map: LabelMap, group: EvalGroup
) -> EvalFn:
    """The 24 COCO metrics and per-class AP on the validation shards (ground truth
    ``val_json_file``), and the validation losses beside them."""
    from maskops.data.pipeline import build_eval_loader
    from maskops.evaluation.coco import IouType
    from maskops.evaluation.predictor import TorchPredictor
    from maskops.evaluation.runner import format_per_class

    iou_types: tuple[IouType, ...] = (
        ("bbox", "segm") if spec.maskrcnn_config.include_mask else ("bbox",)
    )
    evaluator = COCOEvaluator(spec.data_config.val_json_file, label_map, iou_types=iou_types)
    autocast_dtype = amp.dtype if amp.enabled else None
    losses = loss_eval_fn(spec, info, amp, label_map, group)

    def evaluate(model: nn.Module, step: int) -> dict[str, float]:
        predictor = TorchPredictor(model, device=info.device, autocast_dtype=autocast_dtype)
        # Ground truth comes from val_json_file: the loader need not decode masks.
        loader = build_eval_loader(
            spec,
            label_map=label_map,
            with_masks=False,
            rank=info.rank,
            world_size=info.world_size,
        )
        metrics, rows = sharded_coco_metrics(predictor, loader, evaluator, group)
        if info.is_main:
            logger.info("per-class AP at step %d:\n%s", step, format_per_class(rows))
        return metrics | per_class_metrics(rows) | losses(model, step)

    return evaluate


def per_class_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``AP/<name>`` and ``mask_AP/<name>`` scalars of per-class rows (for TensorBoard and
    metrics.jsonl; the log shows them as a table instead)."""
    return {
        f"{key}/{row['name']}": float(row[key])
        for row in rows
        for key in PER_CLASS_KEYS
        if key in row
    }


def default_eval_fn(
    spec: ExperimentSpec, info: RankInfo, amp: AmpSettings, label_map: LabelMap, group: EvalGroup
) -> EvalFn:
    """COCO metrics when the spec names ``val_json_file``, else the validation loss."""
    if spec.data_config.val_json_file:
        return coco_eval_fn(spec, info, amp, label_map, group)
    return loss_eval_fn(spec, info, amp, label_map, group)
