"""TAO's filter-importance rules: per-layer normalised filter norms, equalised across groups.

Everything here is a pure function on tensors; the dependency bookkeeping that decides which
layers form a group lives in :mod:`maskops.prune.pruner`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from maskops.prune.options import EQUALIZATIONS, NORMS, Equalization, Norm

# Guards divisions and logs against all-zero layers (a layer of zero filters normalises to 0).
_EPS = 1e-12


def filter_norms(weight: torch.Tensor) -> torch.Tensor:
    """L2 norm of each output filter.

    Args:
        weight: a conv kernel ``[C_out, C_in/groups, kH, kW]`` (or any ``[C_out, ...]``).

    Returns:
        ``[C_out]`` float32 norms.
    """
    return weight.detach().float().flatten(1).norm(p=2, dim=1)


def normalize_norms(norms: torch.Tensor, norm: Norm) -> torch.Tensor:
    """Normalise one layer's filter norms ``[C]`` so that they are comparable across layers.

    ``max`` divides by the largest norm (the strongest filter scores 1); ``L2`` divides by the
    L2 norm of the vector of norms (scores shrink as the layer widens: with C equal filters
    each scores ``1/sqrt(C)``).
    """
    if norm == "max":
        denominator = norms.max()
    elif norm == "L2":
        denominator = norms.norm(p=2)
    else:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
    return norms / denominator.clamp_min(_EPS)


def equalize(scores: Sequence[torch.Tensor], equalization: Equalization) -> torch.Tensor:
    """Combine the normalised scores ``[C]`` of layers that must keep the same channels.

    The result is one ``[C]`` score such that "combined >= threshold" is the criterion's
    keep rule: ``union`` is the maximum (a channel any member keeps survives),
    ``intersection`` the minimum (only channels every member keeps survive), and the means
    are the arithmetic / geometric mean of the members' normalised norms.
    """
    if not scores:
        raise ValueError("equalize needs at least one layer's scores")
    stacked = torch.stack(list(scores))
    if equalization == "union":
        return stacked.max(dim=0).values
    if equalization == "intersection":
        return stacked.min(dim=0).values
    if equalization == "arithmetic_mean":
        return stacked.mean(dim=0)
    if equalization == "geometric_mean":
        return stacked.clamp_min(_EPS).log().mean(dim=0).exp()
    raise ValueError(
        f"equalization must be one of {', '.join(EQUALIZATIONS)}, got {equalization!r}"
    )


def num_channels_to_keep(
    scores: torch.Tensor, *, threshold: float, granularity: int, min_filters: int
) -> int:
    """How many of a group's ``[C]`` channels survive.

    Channels scoring under ``threshold`` go, but the kept count is rounded up to a multiple
    of ``granularity`` and never falls under ``min_filters`` (itself rounded up to the
    granularity), and never exceeds ``C``. A group of ``min_filters`` or fewer channels is
    left as it is.
    """
    total = int(scores.numel())
    wanted = int((scores >= threshold).sum())
    kept = max(wanted, min_filters)
    kept = math.ceil(kept / granularity) * granularity
    return min(total, kept)


def channels_to_prune(scores: torch.Tensor, keep: int) -> list[int]:
    """Indices (ascending) of the ``C - keep`` lowest-scoring channels of ``scores [C]``.

    Ties are broken by channel index so that the result is deterministic.
    """
    order = sorted(range(int(scores.numel())), key=lambda i: (-float(scores[i]), i))
    return sorted(order[keep:])
