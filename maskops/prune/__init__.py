"""Structured filter pruning (TAO's ``prune``): physically smaller backbone and FPN.

What a prune does is :class:`~maskops.prune.options.PruneOptions`. Importing this package
imports nothing heavy: the names below are imported from their modules on first use, so
that :mod:`maskops.prune.options` (standard library only) is what the control plane imports
of the prune.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maskops.prune.options import EQUALIZATIONS, NORMS, Equalization, Norm, PruneOptions
    from maskops.prune.pruner import PruneError, prune_model
    from maskops.prune.report import GroupDecision, LayerChannels, PruneReport

_HOMES = {
    "EQUALIZATIONS": "options",
    "NORMS": "options",
    "Equalization": "options",
    "Norm": "options",
    "PruneOptions": "options",
    "PruneError": "pruner",
    "prune_model": "pruner",
    "GroupDecision": "report",
    "LayerChannels": "report",
    "PruneReport": "report",
}

__all__ = [
    "EQUALIZATIONS",
    "NORMS",
    "Equalization",
    "GroupDecision",
    "LayerChannels",
    "Norm",
    "PruneError",
    "PruneOptions",
    "PruneReport",
    "prune_model",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"maskops.prune.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
