"""Loss on the validation set: the periodic evaluation used when COCO metrics are absent."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from maskops.training.trainer import AmpSettings, Batch, move_batch, tao_loss_name

VAL_PREFIX = "val/"


LossSums = tuple[dict[str, float], int]
"""``({"val/<TAO name>": sum over batches}, batches)``: what ranks add up."""


def validation_loss(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    device: torch.device,
    amp: AmpSettings,
) -> dict[str, float]:
    """Mean training losses over the validation batches, keyed ``val/<TAO name>``
    (see :func:`validation_loss_sums`)."""
    return mean_losses([validation_loss_sums(model, batches, device=device, amp=amp)])


def mean_losses(parts: Iterable[LossSums]) -> dict[str, float]:
    """The mean per batch over all batches of ``parts`` (one per rank); {} without any."""
    sums: dict[str, float] = {}
    count = 0
    for part_sums, part_count in parts:
        for key, value in part_sums.items():
            sums[key] = sums.get(key, 0.0) + value
        count += part_count
    return {k: v / count for k, v in sums.items()} if count else {}


@torch.no_grad()
def validation_loss_sums(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    device: torch.device,
    amp: AmpSettings,
) -> LossSums:
    """Training losses summed over the validation batches, and the number of batches.

    The model runs in training mode (only it computes losses) with every batch-norm layer
    in eval mode, so validation never changes the running statistics.
    """
    was_training = model.training
    model.train()
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.eval()
    sums: dict[str, float] = {}
    batches_seen = 0
    try:
        for batch in batches:
            images, targets = move_batch(batch, device)
            with amp.autocast():
                loss_dict = model(images, targets)
            total = 0.0
            for key, value in loss_dict.items():
                name = VAL_PREFIX + tao_loss_name(key)
                sums[name] = sums.get(name, 0.0) + float(value)
                total += float(value)
            sums[VAL_PREFIX + "Total loss"] = sums.get(VAL_PREFIX + "Total loss", 0.0) + total
            batches_seen += 1
    finally:
        model.train(was_training)
    return sums, batches_seen
