"""The periodic evaluation of a training run, sharded across its ranks.

First every rank takes rank 0's buffers (batch-norm statistics, which DDP leaves to differ
after a step: :meth:`~maskops.training.distributed.EvalGroup.share_buffers`), so that all
evaluate the model rank 0 checkpoints. Each rank then evaluates its own slice of the
validation set: the evaluation loader of rank ``r`` of ``W`` takes samples
``r, r + W, ...``, so every image is evaluated exactly once and the slices differ by at
most one image when ``W`` does not divide their number. The ranks then meet on the
:class:`~maskops.training.distributed.EvalGroup` (gloo, a long timeout): rank 0 gathers
every image's COCO results and every rank's validation-loss sums, computes the metrics
(the same as a one-rank evaluation of the checkpoint: same detections, evaluated in image
id order) and broadcasts them, so that all ranks leave the evaluation together and with
the same figures. A rank waits for its peers as long as the slowest shard takes, then for
rank 0's COCO computation; never on the training group.

A cancel requested during an evaluation stops it: every rank that sees the request stops
between two batches, and the evaluation is abandoned on every rank
(:class:`~maskops.training.errors.EvaluationAbandoned`) as soon as those still running are
done or see it too, instead of keeping the run from stopping until the slowest shard ends.

Every rank builds its evaluation function at the same point and calls it at the same steps
(:class:`~maskops.training.hooks.EvalHook` on every rank).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from torch import nn

from maskops.data.labels import LabelMap
from maskops.evaluation.evaluator import COCOEvaluator, EvaluatorState
from maskops.evaluation.predictor import Predictor
from maskops.evaluation.runner import Batch
from maskops.spec.models import ExperimentSpec
from maskops.training.distributed import EvalGroup, RankInfo
from maskops.training.errors import EvaluationAbandoned
from maskops.training.hooks import PER_CLASS_KEYS, EvalFn
from maskops.training.trainer import AmpSettings
from maskops.training.validation import mean_losses, validation_loss_sums

logger = logging.getLogger("maskops.train")

T = TypeVar("T")
R = TypeVar("R")


StopCheck = Callable[[], bool]
"""Polled between batches: true once a cancel was requested
(:func:`~maskops.training.hooks.cancel_check`)."""


def _never() -> bool:
    return False


def _until(batches: Iterable[T], stop: StopCheck, stopped: list[bool]) -> Iterator[T]:
    """``batches`` until ``stop()`` (checked before each); ``stopped`` records whether it was."""
    for batch in batches:
        if stop():
            stopped.append(True)
            return
        yield batch


def _decided(group: EvalGroup, part: T | None, finish: Callable[[list[T]], R]) -> R:
    """Gather every rank's ``part`` (None: that rank was stopped) to rank 0, which
    passes them to ``finish``, and hand its result to every rank.

    Raises:
        EvaluationAbandoned: a rank was stopped (on every rank alike).
    """
    parts = group.gather(part)
    outcome: tuple[bool, R | None] = (False, None)
    if group.is_main:
        complete = [p for p in parts if p is not None]
        outcome = (True, finish(complete)) if len(complete) == len(parts) else (False, None)
    done, result = group.broadcast(outcome)
    if not done:
        raise EvaluationAbandoned()
    assert result is not None
    return result


def sharded_coco_metrics(
    predictor: Predictor,
    loader: Iterable[Batch],
    evaluator: COCOEvaluator,
    group: EvalGroup,
    *,
    stop: StopCheck = _never,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """COCO metrics and per-class rows of all ranks' images, on every rank.

    ``loader`` yields this rank's slice; ``evaluator`` converts its outputs to COCO results
    here, and on rank 0 evaluates the union of every rank's (an image in two slices is an
    :class:`~maskops.evaluation.errors.EvaluationError`).

    Raises:
        EvaluationAbandoned: ``stop()`` became true on a rank before its slice was done.
    """
    evaluator.reset()
    stopped: list[bool] = []
    for images, targets in _until(loader, stop, stopped):
        evaluator.process(targets, predictor(list(images)))

    def finish(states: list[EvaluatorState]) -> tuple[dict[str, float], list[dict[str, Any]]]:
        evaluator.load(states)
        return evaluator.evaluate(), evaluator.per_class()

    return _decided(group, None if stopped else evaluator.state(), finish)


def sharded_validation_loss(
    model: nn.Module,
    loader: Iterable[Any],
    info: RankInfo,
    amp: AmpSettings,
    group: EvalGroup,
    *,
    stop: StopCheck = _never,
) -> dict[str, float]:
    """Mean validation losses per batch over every rank's batches, on every rank.

    Raises:
        EvaluationAbandoned: as :func:`sharded_coco_metrics`.
    """
    stopped: list[bool] = []
    sums = validation_loss_sums(model, _until(loader, stop, stopped), device=info.device, amp=amp)
    return _decided(group, None if stopped else sums, mean_losses)


def _loss_pass(
    spec: ExperimentSpec,
    info: RankInfo,
    amp: AmpSettings,
    label_map: LabelMap,
    group: EvalGroup,
    stop: StopCheck,
) -> Callable[[nn.Module], dict[str, float]]:
    """The validation losses of a model whose buffers the ranks already share."""
    from maskops.data.pipeline import build_eval_loader

    def losses(model: nn.Module) -> dict[str, float]:
        loader = build_eval_loader(
            spec, label_map=label_map, rank=info.rank, world_size=info.world_size
        )
        return sharded_validation_loss(model, loader, info, amp, group, stop=stop)

    return losses


def loss_eval_fn(
    spec: ExperimentSpec,
    info: RankInfo,
    amp: AmpSettings,
    label_map: LabelMap,
    group: EvalGroup,
    stop: StopCheck = _never,
) -> EvalFn:
    """The validation losses (``val/<TAO loss name>``, ``val/Total loss``)."""
    losses = _loss_pass(spec, info, amp, label_map, group, stop)

    def evaluate(model: nn.Module, step: int) -> dict[str, float]:
        group.share_buffers(model)
        return losses(model)

    return evaluate


def coco_eval_fn(
    spec: ExperimentSpec,
    info: RankInfo,
    amp: AmpSettings,
    label_map: LabelMap,
    group: EvalGroup,
    stop: StopCheck = _never,
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
    losses = _loss_pass(spec, info, amp, label_map, group, stop)

    def evaluate(model: nn.Module, step: int) -> dict[str, float]:
        group.share_buffers(model)
        predictor = TorchPredictor(model, device=info.device, autocast_dtype=autocast_dtype)
        # Ground truth comes from val_json_file: the loader need not decode masks.
        loader = build_eval_loader(
            spec,
            label_map=label_map,
            with_masks=False,
            rank=info.rank,
            world_size=info.world_size,
        )
        metrics, rows = sharded_coco_metrics(predictor, loader, evaluator, group, stop=stop)
        if info.is_main:
            logger.info("per-class AP at step %d:\n%s", step, format_per_class(rows))
        return metrics | per_class_metrics(rows) | losses(model)

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
    spec: ExperimentSpec,
    info: RankInfo,
    amp: AmpSettings,
    label_map: LabelMap,
    group: EvalGroup,
    stop: StopCheck = _never,
) -> EvalFn:
    """COCO metrics when the spec names ``val_json_file``, else the validation loss; each
    stops between two batches once ``stop()`` is true on a rank (``EvaluationAbandoned``)."""
    if spec.data_config.val_json_file:
        return coco_eval_fn(spec, info, amp, label_map, group, stop)
    return loss_eval_fn(spec, info, amp, label_map, group, stop)
