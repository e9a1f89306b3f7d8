"""What a prune does: the one definition of the prune options.

:class:`PruneOptions` is what :func:`maskops.prune.run.run_prune` takes; the ``maskops
prune`` flags (:mod:`maskops.cli.prune`, each field's ``flag``) and the REST prune job's
options (``maskops_core.options.PruneOptions``, which takes its defaults and choices from
here) are the same fields with the same defaults (tests/unit/prune/test_prune_options.py
checks all three). Standard library only, so that the control plane's core imports it
without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args

Norm = Literal["max", "L2"]
NORMS: tuple[str, ...] = get_args(Norm)
Equalization = Literal["union", "intersection", "arithmetic_mean", "geometric_mean"]
EQUALIZATIONS: tuple[str, ...] = get_args(Equalization)


@dataclass(frozen=True)
class PruneOptions:
    """The prune's options (see :func:`maskops.prune.prune_model`); each has TAO's
    ``maskops prune`` flag named in ``flag``."""

    norm: Norm = field(default="max", metadata={"flag": "--normalizer"})
    """Per-layer normaliser of the filter norms."""
    equalization: Equalization = field(
        default="union", metadata={"flag": "--equalization_criterion"}
    )
    """How layers whose outputs are added combine their importances."""
    granularity: int = field(default=8, metadata={"flag": "--pruning_granularity"})
    """Kept filters per layer are a multiple of this."""
    threshold: float = field(default=0.1, metadata={"flag": "--pruning_threshold"})
    """Filters whose normalised norm is under this are removed."""
    min_filters: int = field(default=16, metadata={"flag": "--min_num_filters"})
    """Never keep fewer filters than this in a layer."""
    excluded_layers: tuple[str, ...] = field(default=(), metadata={"flag": "--excluded_layers"})
    """Module names (or prefixes) never pruned."""


def cli_flag(name: str) -> str:
    """The ``maskops prune`` flag of option ``name``."""
    flag: str = _FIELDS[name].metadata["flag"]
    return flag


_FIELDS = {f.name: f for f in fields(PruneOptions)}
DEFAULTS = PruneOptions()
"""Every option at its default."""
