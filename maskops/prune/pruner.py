"""Structured filter pruning of a Mask R-CNN's backbone, FPN and RPN head conv.

torch-pruning's DependencyGraph does the channel bookkeeping. It traces a probe module
(:class:`_ChannelProbe`) made of the model's own layers: the backbone (ResNet body + FPN),
the RPN head and the first layers of the box and mask heads, run on a plain tensor so that
none of the detection heads' list/dict control flow is traced. It yields one group per set
of coupled channels: a conv's filters together with its BatchNorm and the input channels of
every consumer, and, where outputs are added (ResNet residual stages, the FPN's lateral 1x1
convs tied by the top-down additions), all the convs of that sum. TAO's importance rules
(:mod:`maskops.prune.importance`) decide which channels of each group go; what those
channels still contributed (a constant: their bias or BatchNorm shift) is folded into the
layers that read them (:mod:`maskops.prune.compensation`), and the group is cut physically.

Design decision: the FPN's output channels are pruned too, and the cut is propagated into
the heads' inputs (the RPN head conv, the box head's first Linear through RoIAlign and its
flatten, the mask head's first conv). They are shared by every pyramid level and by the
three heads, so all FPN output convs form one group. Only producers in the backbone and the
RPN head's shared conv are pruned; the RoI heads' own widths (fast_rcnn_mlp_head_dim, the
mask head convs) and every prediction layer keep their sizes.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
import torch_pruning as tp
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from maskops.modeling import prunable_convs
from maskops.prune.compensation import compensate_removed_channels
from maskops.prune.cost import count_parameters, macs, output_positions, roi_output_size
from maskops.prune.importance import (
    channels_to_prune,
    equalize,
    filter_norms,
    normalize_norms,
    num_channels_to_keep,
)
from maskops.prune.options import EQUALIZATIONS, NORMS, Equalization, Norm
from maskops.prune.report import GroupDecision, LayerChannels, PruneReport


class PruneError(ValueError):
    """Bad pruning options or a model maskops cannot prune; the message is one line."""


class _FrozenBatchNormPruner(tp.pruner.function.BasePruningFunc):
    """torch-pruning knows BatchNorm2d; torchvision's FrozenBatchNorm2d keeps its affine
    parameters and statistics as buffers, which must be cut along with the channels."""

    TARGET_MODULES = (FrozenBatchNorm2d,)

    def prune_out_channels(self, layer: nn.Module, idxs: Sequence[int]) -> nn.Module:
        dropped = set(idxs)
        keep = torch.tensor(
            [i for i in range(self.get_out_channels(layer)) if i not in dropped], dtype=torch.long
        )
        for name in ("weight", "bias", "running_mean", "running_var"):
            buffer = getattr(layer, name)
            setattr(layer, name, buffer.index_select(0, keep.to(buffer.device)))
        return layer

    prune_in_channels = prune_out_channels

    def get_out_channels(self, layer: nn.Module) -> int:
        return int(cast(torch.Tensor, layer.weight).shape[0])

    get_in_channels = get_out_channels


def _validate_options(
    *, norm: str, equalization: str, granularity: int, threshold: float, min_filters: int
) -> None:
    if norm not in NORMS:
        raise PruneError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
    if equalization not in EQUALIZATIONS:
        raise PruneError(
            f"equalization must be one of {', '.join(EQUALIZATIONS)}, got {equalization!r}"
        )
    if granularity < 1:
        raise PruneError(f"granularity must be >= 1, got {granularity}")
    if not 0.0 <= threshold <= 1.0:
        raise PruneError(f"threshold must be within [0, 1], got {threshold}")
    if min_filters < 1:
        raise PruneError(f"min_filters must be >= 1, got {min_filters}")


def _as_batch(example_inputs: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """``[N, 3, H, W]`` from a batch tensor or a list of ``[3, H, W]`` images of one size."""
    if isinstance(example_inputs, torch.Tensor):
        batch = example_inputs if example_inputs.ndim == 4 else example_inputs[None]
    else:
        images = list(example_inputs)
        if not images or len({tuple(i.shape) for i in images}) != 1:
            raise PruneError("example_inputs must be non-empty [3, H, W] images of one size")
        batch = torch.stack(images)
    if batch.ndim != 4 or batch.shape[1] != 3:
        raise PruneError(f"example_inputs must be [N, 3, H, W], got {tuple(batch.shape)}")
    return batch.float()


def _layer_channels(model: nn.Module) -> dict[str, tuple[int, int]]:
    """(in, out) of every conv of backbone, RPN and RoI heads, and of the RoI heads' Linears:
    the layers pruning may touch, as producers or as consumers of FPN outputs."""
    channels: dict[str, tuple[int, int]] = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d) and name.startswith(("backbone.", "rpn.", "roi_heads.")):
            channels[name] = (m.in_channels, m.out_channels)
        elif isinstance(m, nn.Linear) and name.startswith("roi_heads."):
            channels[name] = (m.in_features, m.out_features)
    return channels


def _resolve_excluded(names: Sequence[str], convs: dict[str, nn.Conv2d]) -> set[nn.Module]:
    """Convs named by ``names``: a full module name, or a prefix naming a whole block."""
    excluded: set[nn.Module] = set()
    for raw in names:
        name = raw.strip().rstrip(".")
        matches = [m for n, m in convs.items() if n == name or n.startswith(name + ".")]
        if not matches:
            examples = ", ".join(list(convs)[:3])
            raise PruneError(
                f"excluded layer {raw!r} names no convolution of the backbone/FPN "
                f"(module names look like {examples})"
            )
        excluded.update(matches)
    return excluded


class _ChannelProbe(nn.Module):
    """The model's layers wired so that a tensor forward shows every channel dependency.

    Not the model's computation: the RoI heads read one RoIAlign level per box, which is
    expressed here by pooling every FPN level to the RoI size and averaging, so that the
    heads' first layers depend on all FPN outputs, and the FPN outputs on each other, exactly
    as in the real model (the RPN head also runs on every level there). Averaging (not
    summing) keeps the scale of what the heads read, which the compensation measures.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.backbone = cast(nn.Module, model.backbone)
        rpn = getattr(model, "rpn", None)
        roi_heads = getattr(model, "roi_heads", None)
        self.rpn_head = getattr(rpn, "head", None)
        self.box_head = getattr(roi_heads, "box_head", None)
        self.mask_head = getattr(roi_heads, "mask_head", None)
        self.box_size = (
            roi_output_size(getattr(roi_heads, "box_roi_pool", None)) if self.box_head else (7, 7)
        )
        self.mask_size = (
            roi_output_size(getattr(roi_heads, "mask_roi_pool", None))
            if self.mask_head
            else (14, 14)
        )

    def forward(self, images: torch.Tensor) -> list[Any]:
        features = list(self.backbone(images).values())
        outputs: list[Any] = list(features)
        if self.rpn_head is not None:
            outputs.append(self.rpn_head(features))
        for head, size in ((self.box_head, self.box_size), (self.mask_head, self.mask_size)):
            if head is not None:
                levels = [F.adaptive_avg_pool2d(f, size) for f in features]
                pooled = functools.reduce(operator.add, levels) / len(levels)
                outputs.append(head(pooled))
        return outputs


def prune_model(
    model: nn.Module,
    *,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    norm: Norm = "max",
    equalization: Equalization = "union",
    granularity: int = 8,
    threshold: float = 0.1,
    min_filters: int = 16,
    excluded_layers: Sequence[str] = (),
    macs_image_size: tuple[int, int] | None = None,
) -> PruneReport:
    """Remove low-norm conv filters from the backbone, FPN and RPN head conv, in place.

    Args:
        model: a torchvision-style Mask R-CNN: ``model.backbone`` maps ``[N, 3, H, W]`` to a
            dict of FPN feature maps read by ``model.rpn.head`` and, through RoIAlign, by
            ``model.roi_heads.box_head`` / ``mask_head``.
        example_inputs: images the model would see, already resized and padded: a float
            ``[N, 3, H, W]`` batch or a list of ``[3, H, W]`` tensors of one size. Used only
            to trace the layers; a small size (e.g. 128x128) is enough.
        norm: per-layer normalisation of the filter norms, ``max`` or ``L2``.
        equalization: how coupled layers' normalised norms combine (see importance.equalize).
        granularity: kept channels per group are a multiple of this.
        threshold: channels whose combined normalised norm is under this are removed.
        min_filters: never keep fewer channels than this in a group.
        excluded_layers: module names (``backbone.body.layer1.0.conv1``) or prefixes
            (``backbone.body.layer4``) of convs never pruned; every group touching one of
            them, as producer or consumer, is left whole.
        macs_image_size: (H, W) at which to count MACs; defaults to the example's size.

    Returns:
        The report (parameters, MACs, per-layer channels, per-group decisions).
    """
    _validate_options(
        norm=norm,
        equalization=equalization,
        granularity=granularity,
        threshold=threshold,
        min_filters=min_filters,
    )
    if not isinstance(getattr(model, "backbone", None), nn.Module):
        raise PruneError("the model has no .backbone module: not a torchvision-style Mask R-CNN")
    batch = _as_batch(example_inputs).to(next(model.parameters()).device)
    image_size = macs_image_size or (int(batch.shape[2]), int(batch.shape[3]))
    prunable = prunable_convs(model)
    excluded = _resolve_excluded(excluded_layers, prunable)
    channels_before = _layer_channels(model)
    before = _Cost.of(model, image_size)
    restore = _restorer(model)
    probe = _ChannelProbe(model)
    graph = _dependency_graph(probe, batch)
    rule = _Rule(norm, equalization, granularity, threshold, min_filters)
    decisions, cuts = _decide(model, graph, set(prunable.values()), excluded, rule)
    model.eval()
    compensate_removed_channels(model, cuts, graph, run=lambda: probe(batch))
    for cut in cuts:
        cut.prune()
    restore()
    after = _Cost.of(model, image_size, positions=before.positions)
    channels_after = _layer_channels(model)
    layers = [
        LayerChannels(name, *channels_before[name], *channels_after[name])
        for name in channels_before
    ]
    return rule.report(list(excluded_layers), image_size, before, after, layers, decisions)


@dataclass(frozen=True)
class _Cost:
    """A model's size: parameters, and MACs of the dense part and of the RoI heads."""

    params: int
    macs: int
    roi_macs: int
    positions: tuple[dict[str, int], dict[str, int]]
    """Where the dense and RoI layers' outputs are counted (kept so that the pruned model
    is counted at the same positions)."""

    @classmethod
    def of(
        cls,
        model: nn.Module,
        image_size: tuple[int, int],
        positions: tuple[dict[str, int], dict[str, int]] | None = None,
    ) -> _Cost:
        dense, roi = positions or output_positions(model, image_size)
        return cls(count_parameters(model), macs(model, dense), macs(model, roi), (dense, roi))


@dataclass(frozen=True)
class _Rule:
    """TAO's pruning options (see :func:`prune_model`)."""

    norm: Norm
    equalization: Equalization
    granularity: int
    threshold: float
    min_filters: int

    def report(
        self,
        excluded_layers: list[str],
        image_size: tuple[int, int],
        before: _Cost,
        after: _Cost,
        layers: list[LayerChannels],
        groups: list[GroupDecision],
    ) -> PruneReport:
        return PruneReport(
            norm=self.norm,
            equalization=self.equalization,
            granularity=self.granularity,
            threshold=self.threshold,
            min_filters=self.min_filters,
            excluded_layers=excluded_layers,
            image_size=image_size,
            params_before=before.params,
            params_after=after.params,
            macs_before=before.macs,
            macs_after=after.macs,
            roi_macs_before=before.roi_macs,
            roi_macs_after=after.roi_macs,
            layers=layers,
            groups=groups,
        )


def _dependency_graph(probe: _ChannelProbe, batch: torch.Tensor) -> tp.DependencyGraph:
    """torch-pruning's coupled-channel groups of the probe's layers."""
    # Frozen layers' outputs carry no autograd history, which is what torch-pruning traces:
    # an input that requires grad gives every layer one.
    traced = batch.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        return tp.DependencyGraph().build_dependency(
            probe,
            example_inputs=traced,
            # A bare tensor would be star-unpacked by torch-pruning (``model(*inputs)``).
            forward_fn=lambda module, inputs: module(inputs),
            customized_pruners={FrozenBatchNorm2d: _FrozenBatchNormPruner()},
            verbose=False,
        )


def _decide(
    model: nn.Module,
    graph: tp.DependencyGraph,
    prunable_modules: set[nn.Module],
    excluded: set[nn.Module],
    rule: _Rule,
) -> tuple[list[GroupDecision], list[tp.Group]]:
    """What happens to each group of coupled channels, and the cuts of those pruned."""
    names = {m: n for n, m in model.named_modules()}
    decisions: list[GroupDecision] = []
    cuts: list[tp.Group] = []
    for group in list(graph.get_all_groups(root_module_types=[nn.Conv2d, nn.Linear])):
        producers = [item for item in group if graph.is_out_channel_pruning_fn(item.dep.handler)]
        if not {item.dep.target.module for item in producers} & prunable_modules:
            continue  # a group of the RoI heads' own layers: never pruned
        touched = {item.dep.target.module for item in group}
        # Parameterless ops (adds, activations) also appear as producers; weights decide.
        weighted = [item for item in producers if isinstance(item.dep.target.module, nn.Conv2d)]
        members = tuple(names[item.dep.target.module] for item in weighted)
        size = len(group[0].idxs)
        if touched & excluded:
            decisions.append(GroupDecision(members, size, size, "excluded"))
            continue
        if not {item.dep.target.module for item in weighted} <= prunable_modules:
            decisions.append(GroupDecision(members, size, size, "fixed"))
            continue
        keep, pruned = _channels(weighted, size, rule)
        decisions.append(GroupDecision(members, size, keep, "pruned" if pruned else "kept"))
        if pruned:
            root = group[0].dep
            cuts.append(graph.get_pruning_group(root.target.module, root.handler, pruned))
    return decisions, cuts


def _channels(weighted: Sequence[Any], size: int, rule: _Rule) -> tuple[int, list[int]]:
    """How many of a group's ``size`` channels stay, and which go, by TAO's rules."""
    scores = []
    for item in weighted:
        normalised = normalize_norms(filter_norms(item.dep.target.module.weight), rule.norm)
        score = torch.zeros(size)
        score[torch.tensor(item.root_idxs)] = normalised[torch.tensor(item.idxs)]
        scores.append(score)
    combined = equalize(scores, rule.equalization)
    keep = num_channels_to_keep(
        combined,
        threshold=rule.threshold,
        granularity=rule.granularity,
        min_filters=rule.min_filters,
    )
    return keep, channels_to_prune(combined, keep)


def _restorer(model: nn.Module) -> Callable[[], None]:
    """What puts back the model's parameters' requires_grad and its train/eval mode after
    the cut (torch-pruning rebuilds pruned parameters as fresh, trainable Parameters)."""
    requires_grad = {n: p.requires_grad for n, p in model.named_parameters()}
    was_training = model.training

    def restore() -> None:
        for name, param in model.named_parameters():
            param.requires_grad_(requires_grad.get(name, True))
        _sync_out_channels(model)
        model.train(was_training)

    return restore


def _sync_out_channels(model: nn.Module) -> None:
    """Keep ``backbone.out_channels`` (torchvision's record of the FPN width) truthful."""
    backbone = cast(nn.Module, model.backbone)
    fpn = getattr(backbone, "fpn", None)
    layer_blocks = getattr(fpn, "layer_blocks", None)
    if hasattr(backbone, "out_channels") and isinstance(layer_blocks, nn.ModuleList):
        convs = [m for m in layer_blocks.modules() if isinstance(m, nn.Conv2d)]
        if convs:
            setattr(backbone, "out_channels", convs[-1].out_channels)  # noqa: B010
