# ruff: noqa: RUF009 - option() is dataclasses.field with the declared metadata
"""What an evaluation does: the declaration of the evaluate options.

:class:`EvaluateOptions` is what :func:`maskops.evaluation.runner.run_evaluation` takes; the
``maskops evaluate`` flags and the REST evaluate job's options are built from its fields
(:mod:`maskops.options_schema`). Standard library only, so that the control plane's core
imports it without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from maskops.options_schema import GPU_INDEX_HELP, MAX_GPU_INDEX, option

GPU_INDEX = 0
"""The CUDA device an evaluation or inference uses by default (where CUDA is available)."""


@dataclass(frozen=True)
class EvaluateOptions:
    """The evaluation's options (declared: :mod:`maskops.options_schema`)."""

    gpu_index: int | None = option(
        GPU_INDEX,
        help=GPU_INDEX_HELP,
        rest=True,
        ge=0,
        le=MAX_GPU_INDEX,
    )
    image_dir: Path | None = option(
        None,
        help="val_json_file's images, for a spec without validation_file_pattern",
        flag=("-i", "--image_dir"),
    )


DEFAULTS = EvaluateOptions()
"""Every option at its default."""
