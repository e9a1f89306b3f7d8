"""How a training runs: the one definition of the train options.

:class:`TrainOptions` says how many ranks and hosts train and on which device; the ``maskops
train`` flags (:mod:`maskops.cli.train`, each field's ``flag``) are its fields, and the REST
train job's options (``maskops_core.options.TrainOptions``) are those of its fields a job
sets, with the same defaults (tests/unit/training/test_train_options.py checks all three).
What to train is the spec. Standard library only, so that the control plane's core imports
it without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def _option(default: Any, flag: str | None = None) -> Any:
    """A field whose ``maskops train`` flag is ``flag``, else ``--<field>``."""
    return field(default=default, metadata={"flag": flag} if flag else {})


@dataclass(frozen=True)
class TrainOptions:
    """The training's options; each has the ``maskops train`` flag of its name unless
    ``flag`` says otherwise."""

    gpus: int = 1
    """Ranks on each host (one per GPU; gloo processes on a CPU), under torchrun beyond one;
    learning rates scale linearly with the ranks of all hosts."""
    gpu_index: int = 0
    """The first CUDA device to use."""
    nodes: int = _option(1, "--nnodes")
    """Hosts of the run, each with ``gpus`` ranks, gathering at ``rdzv_endpoint``."""
    rdzv_endpoint: str = ""
    """``host:port`` of the c10d rendezvous, for several hosts (served by that host)."""
    rdzv_id: str = "maskops"
    """Names the run on every host."""
    max_restarts: int = 0
    """With several ranks: times torchrun restarts them (from the last checkpoint)."""
    use_amp: bool = False
    """Mixed precision whatever the spec says (declined on CPUs without bf16)."""

    def problem(self) -> str | None:
        """Why these options cannot run, naming the flag, or None."""
        if self.gpus < 1:
            return f"--gpus must be >= 1, got {self.gpus}"
        if self.max_restarts < 0:
            return f"--max_restarts must be >= 0, got {self.max_restarts}"
        if self.nodes < 1:
            return f"--nnodes must be >= 1, got {self.nodes}"
        if self.nodes > 1 and not self.rdzv_endpoint:
            return f"--nnodes {self.nodes} needs --rdzv_endpoint HOST:PORT"
        return None

    @property
    def in_process(self) -> bool:
        """One rank on one host: trained in this process, without torchrun."""
        return self.gpus == 1 and self.nodes == 1 and not self.rdzv_endpoint


def cli_flag(name: str) -> str:
    """The ``maskops train`` flag of option ``name``."""
    flag: str | None = _FIELDS[name].metadata.get("flag")
    return flag or f"--{name}"


_FIELDS = {f.name: f for f in fields(TrainOptions)}
DEFAULTS = TrainOptions()
"""Every option at its default."""
