"""Structured filter pruning (TAO's ``prune``): physically smaller backbone and FPN."""

from maskops.prune.importance import EQUALIZATIONS, NORMS, Equalization, Norm
from maskops.prune.pruner import PruneError, prune_model
from maskops.prune.report import GroupDecision, LayerChannels, PruneReport

__all__ = [
    "EQUALIZATIONS",
    "NORMS",
    "Equalization",
    "GroupDecision",
    "LayerChannels",
    "Norm",
    "PruneError",
    "PruneReport",
    "prune_model",
]
