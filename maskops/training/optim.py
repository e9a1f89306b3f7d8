"""Optimizer and regularisers of the recipe: SGD with momentum, L2 and L1 weight decay.

Regularisers apply to weights only: convolution and linear kernels (tensors of rank >= 2),
never biases or normalisation scales and shifts (rank 1). TAO also decays its ResNet's
batch-norm scales (docs/tao-migration.md, known differences). TAO adds
``l2_weight_decay * sum(w**2) / 2`` to the loss; its gradient ``l2_weight_decay * w`` is
exactly SGD's ``weight_decay``, so L2 is applied by the optimizer (one fused update instead
of a second pass over the weights) and its value is computed only when it is logged. L1 has
no optimizer equivalent and is a real penalty added to the loss: TAO's is
``tf.keras.regularizers.l1(l1_weight_decay / 2.0)``, i.e.
``l1_weight_decay / 2 * sum(|w|)``, so the trainer passes :func:`l1_penalty` the weight
``l1_weight_decay * TrainingRules.l1_factor`` (0.5). ``l1_weight_decay_layers: "prunable"``
(a maskops extension) narrows L1 to the kernels pruning may cut: trained from scratch, a
penalty strong enough to drive backbone filters to zero would also wipe out the RoI heads'
fc6, whose many small weights it shrinks by the same amount per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from maskops.modeling import prunable_convs
from maskops.spec.models import L1_WEIGHT_DECAY_LAYERS


def regularized_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters weight decay applies to: kernels of rank >= 2."""
    return [p for p in model.parameters() if p.requires_grad and p.ndim > 1]


def l1_regularized_parameters(model: nn.Module, layers: str) -> Sequence[torch.Tensor]:
    """The kernels L1 applies to: all of :func:`regularized_parameters` (``layers="all"``) or
    only the trainable kernels of the prunable convs (``"prunable"``)."""
    if layers == "all":
        return regularized_parameters(model)
    if layers == "prunable":
        return [conv.weight for conv in prunable_convs(model).values() if conv.weight.requires_grad]
    raise ValueError(
        f"l1_weight_decay_layers must be one of {', '.join(L1_WEIGHT_DECAY_LAYERS)}, got {layers!r}"
    )


def build_optimizer(
    model: nn.Module, *, lr: float, momentum: float, l2_weight_decay: float, fused: bool = False
) -> torch.optim.SGD:
    """SGD with momentum; weight decay on kernels only (see module docstring).

    Frozen parameters (``requires_grad=False``) are left out, so they stay bit-identical.
    ``fused``: torch's fused SGD kernel (same update; else torch's default, ``foreach`` on
    CUDA and a loop over the tensors on a CPU).
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": l2_weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.SGD(
        [g for g in groups if g["params"]],
        lr=lr,
        momentum=momentum,
        weight_decay=0.0,
        fused=True if fused else None,
    )


def l1_penalty(params: Iterable[torch.Tensor], weight: float) -> torch.Tensor:
    """``weight * sum(|w|)`` over ``params`` as a differentiable scalar."""
    return weight * torch.stack([p.abs().sum() for p in params]).sum()


@torch.no_grad()
def l2_loss_value(params: Iterable[torch.Tensor], weight: float) -> float:
    """TAO's logged L2 loss ``weight * sum(w**2) / 2``."""
    total = torch.stack([p.float().pow(2).sum() for p in params]).sum()
    return float(weight * total / 2)
