"""Fold what a removed channel still contributed into the layers that read it.

A filter whose kernel is (near) zero is not a channel of zeros: it outputs its bias, or its
BatchNorm's shift through the ReLU, the same constant at every position, and the layers that
read it have learnt to expect that constant. Cutting the channel removes it. Sparsity
training (``l1_weight_decay``) shrinks kernels, never the biases or BatchNorm shifts that
make these constants, so without compensation the pruned model is not the model the
importance scores judged.

The compensation is data-free, as ``maskops prune`` takes no dataset: the removed filters'
kernels are zeroed, one forward pass measures the now input-independent value ``k_c`` each
consumer reads on every removed input channel ``c``, and ``k_c`` times the consumer's
weights for ``c`` is added to the consumer's bias (or subtracted from the running mean of
the BatchNorm that follows a bias-free conv). The pruned model then computes what the
unpruned model computes with the removed kernels zeroed, exactly for 1x1 convs and Linear
layers and away from the zero-padded borders for larger kernels. Where one consumer reads
several feature maps (the RPN head and the RoI heads read every FPN level, each with its own
constant), the average over the maps is folded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
import torch_pruning as tp
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

_Consumer = nn.Conv2d | nn.Linear


def zero_removed_kernels(groups: Sequence[tp.Group], graph: tp.DependencyGraph) -> None:
    """Zero the kernels (not the biases) of the filters ``groups`` will remove."""
    with torch.no_grad():
        for group in groups:
            for item in group:
                module = item.dep.target.module
                if isinstance(module, nn.Conv2d) and graph.is_out_channel_pruning_fn(
                    item.dep.handler
                ):
                    module.weight[torch.as_tensor(item.idxs, dtype=torch.long)] = 0


def removed_inputs(
    groups: Sequence[tp.Group], graph: tp.DependencyGraph
) -> dict[_Consumer, list[int]]:
    """Each conv/Linear that reads a removed channel, with the input indices it loses."""
    consumers: dict[_Consumer, list[int]] = {}
    for group in groups:
        for item in group:
            module = item.dep.target.module
            if isinstance(module, _Consumer) and graph.is_in_channel_pruning_fn(item.dep.handler):
                consumers.setdefault(module, []).extend(int(i) for i in item.idxs)
    return consumers


@torch.no_grad()
def mean_inputs(
    consumers: Sequence[_Consumer], run: Callable[[], object]
) -> dict[_Consumer, torch.Tensor]:
    """Per-input-channel mean of what each consumer reads while ``run()`` executes.

    Returns:
        ``[C_in]`` per conv (mean over batch and positions of its ``[N, C_in, H, W]``
        input) and ``[in_features]`` per Linear, averaged over the consumer's calls.
    """
    seen: dict[nn.Module, list[torch.Tensor]] = {c: [] for c in consumers}

    def record(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        x = inputs[0].float()
        seen[module].append(x.mean(dim=(0, 2, 3)) if x.ndim == 4 else x.flatten(0, -2).mean(0))

    handles = [c.register_forward_pre_hook(record) for c in consumers]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return {c: torch.stack(seen[c]).mean(dim=0) for c in consumers if seen[c]}


@torch.no_grad()
def fold_constant_inputs(
    consumer: _Consumer,
    idxs: Sequence[int],
    values: torch.Tensor,
    following: nn.Module | None,
) -> None:
    """Add what the constant inputs ``values[idxs]`` contribute to ``consumer``'s outputs.

    Args:
        consumer: a Conv2d (weight ``[C_out, C_in, kH, kW]``, groups 1) or Linear.
        idxs: the input channels (features, for a Linear) about to be removed.
        values: ``[C_in]`` (``[in_features]``) constant each input carries.
        following: the module right after ``consumer``, whose BatchNorm running mean takes
            the contribution when ``consumer`` has no bias (without either, nothing is
            folded: maskops' models have no such consumer).
    """
    index = torch.as_tensor(list(idxs), dtype=torch.long)
    weight = consumer.weight.detach()
    if isinstance(consumer, nn.Conv2d):
        if consumer.groups != 1:
            return
        taps = weight[:, index].float().sum(dim=(2, 3))  # [C_out, len(idxs)]
    else:
        taps = weight[:, index].float()
    contribution = taps @ values[index].to(taps)  # [C_out]
    if consumer.bias is not None:
        consumer.bias.add_(contribution.to(consumer.bias))
    elif isinstance(following, nn.BatchNorm2d | FrozenBatchNorm2d):
        # BN(x - c) with running_mean - c is BN(x): the lost contribution c leaves the mean.
        running_mean = following.running_mean
        if isinstance(running_mean, torch.Tensor):
            running_mean.sub_(contribution.to(running_mean))


def batch_norms_after_convs(model: nn.Module) -> dict[nn.Module, nn.Module]:
    """Each conv whose next sibling module is a BatchNorm of its width (torchvision's
    ``conv1, bn1`` / ``Sequential(conv, bn)`` layout), mapped to that BatchNorm.

    The dependency graph cannot say this: FrozenBatchNorm2d is traced as plain arithmetic.
    """
    following: dict[nn.Module, nn.Module] = {}
    for parent in model.modules():
        children = list(parent.children())
        for conv, after in itertools.pairwise(children):
            if (
                isinstance(conv, nn.Conv2d)
                and isinstance(after, nn.BatchNorm2d | FrozenBatchNorm2d)
                and int(after.running_mean.numel()) == conv.out_channels  # type: ignore[union-attr]
            ):
                following[conv] = after
    return following


def compensate_removed_channels(
    model: nn.Module,
    groups: Sequence[tp.Group],
    graph: tp.DependencyGraph,
    run: Callable[[], object],
) -> None:
    """Zero the kernels ``groups`` remove and fold their constant outputs into consumers.

    Call before ``group.prune()``; ``run()`` must forward ``model`` (in eval mode) through
    every consumer, on any input: what is measured no longer depends on it.
    """
    zero_removed_kernels(groups, graph)
    consumers = removed_inputs(groups, graph)
    means = mean_inputs(list(consumers), run)
    batch_norms = batch_norms_after_convs(model)
    for consumer, idxs in consumers.items():
        if consumer in means:
            fold_constant_inputs(
                consumer, sorted(set(idxs)), means[consumer], batch_norms.get(consumer)
            )
