# ruff: noqa: RUF009 - option() is dataclasses.field with the declared metadata
"""What a prune does: the declaration of the prune options.

:class:`PruneOptions` is what :func:`maskops.prune.run.run_prune` takes; the ``maskops
prune`` flags and the REST prune job's options are built from its fields
(:mod:`maskops.options_schema`). Standard library only, so that the control plane's core
imports it without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from maskops.options_schema import option

Norm = Literal["max", "L2"]
NORMS: tuple[str, ...] = get_args(Norm)
Equalization = Literal["union", "intersection", "arithmetic_mean", "geometric_mean"]
EQUALIZATIONS: tuple[str, ...] = get_args(Equalization)


@dataclass(frozen=True)
class PruneOptions:
    """The prune's options (see :func:`maskops.prune.prune_model`; declared:
    :mod:`maskops.options_schema`)."""

    norm: Norm = option(
        "max",
        help="per-layer normaliser: max (default) or L2",
        flag=("-n", "--normalizer"),
        rest=True,
        # The engine checks the value (its message names the choices).
        cli={"choices": None},
    )
    equalization: Equalization = option(
        "union",
        help="how layers whose outputs are added combine their importances: union (default), "
        "intersection, arithmetic_mean or geometric_mean",
        flag=("-eq", "--equalization_criterion"),
        rest=True,
        cli={"choices": None},
    )
    granularity: int = option(
        8,
        help="kept filters per layer are a multiple of this",
        flag=("-pg", "--pruning_granularity"),
        rest=True,
        ge=1,
        le=4096,
    )
    threshold: float = option(
        0.1,
        help="filters whose normalised norm is under this are removed",
        flag=("-pth", "--pruning_threshold"),
        rest=True,
        ge=0.0,
        le=1.0,
    )
    min_filters: int = option(
        16,
        help="never keep fewer filters than this in a layer",
        flag=("-nf", "--min_num_filters"),
        rest=True,
        ge=1,
        le=4096,
    )
    excluded_layers: tuple[str, ...] = option(
        (),
        help="module names (or prefixes) never pruned, e.g. backbone.body.layer4 (repeatable, "
        "space- or comma-separated)",
        flag=("-el", "--excluded_layers"),
        rest=True,
        max_items=1000,
        cli={"nargs": "+", "action": "extend", "metavar": "LAYER"},
    )


DEFAULTS = PruneOptions()
"""Every option at its default."""
