"""The rules on image and batch sizes that several doors check, each defined once.

Standard library only: the spec schema, the model builder, the exporter, the TensorRT
engine build and the control plane's job options (``maskops_core.options``, allowed to
import this module and :mod:`maskops.atomic` alone of the engine) all call these, so a
size one door accepts no other door refuses.
"""

from __future__ import annotations

from collections.abc import Sequence


def image_stride(max_level: int) -> int:
    """What an input image's sides must divide by: the coarsest feature level's stride."""
    return int(2**max_level)


def image_size_fits(image_size: Sequence[int], max_level: int) -> bool:
    """Whether ``(height, width)`` are both multiples of ``2**max_level``: the FPN halves
    the image ``max_level`` times, and each level must line up with the one above it."""
    stride = image_stride(max_level)
    return all(side % stride == 0 for side in image_size)


def batch_order_error(
    min_batch: int,
    opt_batch: int,
    max_batch: int,
    *,
    names: tuple[str, str, str] = ("min_batch_size", "opt_batch_size", "max_batch_size"),
) -> str | None:
    """None when ``min_batch <= opt_batch <= max_batch`` (a TensorRT optimisation profile's
    order); else the error, naming each size as the caller's door spells it (``names``)."""
    if min_batch <= opt_batch <= max_batch:
        return None
    sizes = (min_batch, opt_batch, max_batch)
    got = ", ".join(f"{name} {value}" for name, value in zip(names, sizes, strict=True))
    return f"batch sizes must satisfy min <= opt <= max, got {got}"
