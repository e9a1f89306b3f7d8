"""What an evaluation does: the one definition of the evaluate options.

:class:`EvaluateOptions` is what :func:`maskops.evaluation.runner.run_evaluation` takes; the
``maskops evaluate`` flags (:mod:`maskops.cli.evaluate`, ``--<field>``) and the REST evaluate
job's options (``maskops_core.options.EvaluateOptions``, which takes its defaults from here)
are the same fields with the same defaults (tests/unit/evaluation/test_evaluate_options.py
checks all three). Standard library only, so that the control plane's core imports it
without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

GPU_INDEX = 0
"""The CUDA device an evaluation uses by default (where CUDA is available)."""


@dataclass(frozen=True)
class EvaluateOptions:
    """The evaluation's options; every one has TAO's ``maskops evaluate`` flag of the same
    name."""

    gpu_index: int | None = GPU_INDEX
    """The CUDA device to use when CUDA is available (the CPU otherwise, or with None)."""
    image_dir: Path | None = None
    """Where val_json_file's images are, for a spec without ``validation_file_pattern``
    (TAO's ``-i``); the shards win when both are set."""


def cli_flag(name: str) -> str:
    """The ``maskops evaluate`` flag of option ``name``."""
    return f"--{_FIELDS[name].name}"


_FIELDS = {f.name: f for f in fields(EvaluateOptions)}
DEFAULTS = EvaluateOptions()
"""Every option at its default."""
