"""What a pruning run did: sizes before/after and per-layer channels, as JSON and a table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class LayerChannels:
    """A conv's (or head Linear's) channels before and after pruning (full module name)."""

    name: str
    in_before: int
    out_before: int
    in_after: int
    out_after: int

    @property
    def changed(self) -> bool:
        return (self.in_before, self.out_before) != (self.in_after, self.out_after)


@dataclass(frozen=True)
class GroupDecision:
    """One coupled group: the convs whose outputs must keep the same channels, and its fate.

    ``status`` is ``pruned``, ``kept`` (nothing under the threshold after rounding),
    ``excluded`` (touches an ``excluded_layers`` conv) or ``fixed`` (coupled to a layer
    outside the prunable set, e.g. a RoI-head layer).
    """

    members: tuple[str, ...]
    channels_before: int
    channels_after: int
    status: str


@dataclass
class PruneReport:
    norm: str
    equalization: str
    granularity: int
    threshold: float
    min_filters: int
    excluded_layers: list[str]
    image_size: tuple[int, int]
    """(H, W) at which ``macs_*`` were counted."""
    params_before: int
    params_after: int
    macs_before: int
    """Multiply-accumulates of backbone + FPN + RPN head on one image (see prune.cost)."""
    macs_after: int
    roi_macs_before: int = 0
    """Multiply-accumulates of the box head for one proposal + mask head for one detection."""
    roi_macs_after: int = 0
    layers: list[LayerChannels] = field(default_factory=list)
    groups: list[GroupDecision] = field(default_factory=list)
    source_model: str = ""
    output_model: str = ""

    @property
    def params_ratio(self) -> float:
        return self.params_after / self.params_before if self.params_before else 1.0

    @property
    def macs_ratio(self) -> float:
        return self.macs_after / self.macs_before if self.macs_before else 1.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["image_size"] = list(self.image_size)
        data["params_ratio"] = self.params_ratio
        data["macs_ratio"] = self.macs_ratio
        return data

    def format_table(self) -> str:
        """A human-readable summary followed by one line per convolution."""
        h, w = self.image_size
        lines = [
            f"pruning: norm={self.norm} equalization={self.equalization} "
            f"granularity={self.granularity} threshold={self.threshold} "
            f"min_filters={self.min_filters} excluded={self.excluded_layers or '-'}",
            f"parameters: {self.params_before:,} -> {self.params_after:,} "
            f"({self.params_ratio:.1%})",
            f"MACs at {h}x{w} (backbone+FPN+RPN head): {self.macs_before / 1e9:.3f} G -> "
            f"{self.macs_after / 1e9:.3f} G ({self.macs_ratio:.1%})",
            f"MACs per RoI (box + mask heads): {self.roi_macs_before / 1e6:.1f} M -> "
            f"{self.roi_macs_after / 1e6:.1f} M",
            "",
        ]
        width = max((len(layer.name) for layer in self.layers), default=5)
        lines.append(f"{'layer':<{width}}  {'in':>11}  {'out':>11}")
        for layer in self.layers:
            mark = "" if layer.changed else "  (unchanged)"
            lines.append(
                f"{layer.name:<{width}}  {layer.in_before:>4} -> {layer.in_after:<4}"
                f"  {layer.out_before:>4} -> {layer.out_after:<4}{mark}"
            )
        return "\n".join(lines)

    def format_groups(self) -> str:
        """One line per coupled group: its fate, channels and member convs (``-v``)."""
        lines = ["coupled groups (convs whose outputs keep the same channels):"]
        for group in self.groups:
            lines.append(
                f"{group.status:<8}  {group.channels_before:>4} -> {group.channels_after:<4}"
                f"  {', '.join(group.members)}"
            )
        return "\n".join(lines)
