"""How a training runs: the declaration of the train options.

:class:`TrainOptions` says how many ranks and hosts train and on which device; the ``maskops
train`` flags and the REST train job's options (those a job sets: the rendezvous is the
workers', restarts the operator's) are built from its fields (:mod:`maskops.options_schema`).
What to train is the spec. Standard library only, so that the control plane's core imports
it without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass

from maskops.options_schema import MAX_GPU_INDEX, option

MAX_RANKS = 64
"""The most ranks (and hosts) a job may ask for."""


@dataclass(frozen=True)
class TrainOptions:
    """The training's options (declared: :mod:`maskops.options_schema`)."""

    gpus: int = option(
        1,
        help="ranks on each host (one per GPU; gloo processes on a CPU), under torchrun "
        "beyond one; learning rates scale linearly with the ranks of all hosts. A job asks "
        "at most what a live worker reports (its GPUs, or MASKOPS_CPU_RANKS gloo processes "
        "on a worker without a GPU)",
        flag=("--gpus", "-np", "--num_processes"),
        rest=True,
        ge=1,
        le=MAX_RANKS,
    )
    gpu_index: int = option(
        0,
        help="the first CUDA device of the ranks (the command line also takes TAO's list, "
        "one index per rank: --gpus 2 --gpu_index 1 3)",
        rest=True,
        ge=0,
        le=MAX_GPU_INDEX,
    )
    nodes: int = option(
        1,
        help="hosts of the run, each with `gpus` ranks, gathering in a c10d rendezvous (a "
        "job's: hosted by the first worker to claim it)",
        flag="--nnodes",
        rest=True,
        ge=1,
        le=MAX_RANKS,
    )
    rdzv_endpoint: str = option(
        "", help="host:port of the c10d rendezvous, for --nnodes > 1 (served by that host)"
    )
    rdzv_id: str = option("maskops", help="names the run on every host")
    max_restarts: int = option(
        0, help="with several ranks: times torchrun restarts them (from the last checkpoint)"
    )
    use_amp: bool = option(
        False,
        help="mixed precision (overrides the spec's use_amp; declined on CPUs without bf16)",
    )

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


DEFAULTS = TrainOptions()
"""Every option at its default."""
