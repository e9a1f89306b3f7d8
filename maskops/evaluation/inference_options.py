"""What an inference does: the one definition of the inference options.

:class:`InferenceOptions` is what :func:`maskops.evaluation.inference.run_inference` takes;
the ``maskops inference`` flags (:mod:`maskops.cli.inference`, ``--<field>``) and the REST
inference job's options (``maskops_core.options.InferenceOptions``, which takes its defaults
from here, drawing masks by default) are the same fields
(tests/unit/evaluation/test_inference_options.py checks all three). Standard library only,
so that the control plane's core imports it without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

THRESHOLD = 0.6
"""The score under which detections are neither drawn nor written, by default."""
GPU_INDEX = 0
"""The CUDA device an inference uses by default (where CUDA is available)."""


@dataclass(frozen=True)
class InferenceOptions:
    """The inference's options; every one has TAO's ``maskops inference`` flag of the same
    name."""

    threshold: float = THRESHOLD
    """Detections scoring below this (0..1) are neither drawn nor written."""
    include_mask: bool = False
    """Draw instance masks (TAO's ``--include_mask``)."""
    gpu_index: int | None = GPU_INDEX
    """The CUDA device to use when CUDA is available (the CPU otherwise, or with None)."""
    annotations: Path | None = None
    """A COCO JSON whose ``images`` give the ids of the files it lists (default: the spec's
    ``val_json_file`` when it exists)."""


def cli_flag(name: str) -> str:
    """The ``maskops inference`` flag of option ``name``."""
    return f"--{_FIELDS[name].name}"


_FIELDS = {f.name: f for f in fields(InferenceOptions)}
DEFAULTS = InferenceOptions()
"""Every option at its default."""
