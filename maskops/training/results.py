"""What a training run leaves in its results directory for others to read, and returns.

Its own module so that the launcher (which starts the ranks and reads rank 0's status)
and the training entry point (which starts the launcher) both import it without importing
each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

STATUS_FILE = "status.json"
"""Rank 0's progress and outcome, replaced atomically as training goes."""


@dataclass(frozen=True)
class TrainResult:
    step: int
    total_steps: int
    checkpoint: Path | None
    metrics: dict[str, float] = field(default_factory=dict)
    stop_reason: str | None = None
    """Why training ended before ``total_steps`` (an early-stop target), else None."""
