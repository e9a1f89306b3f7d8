"""Process-group setup of one rank: one process per device.

Ranks are started by torch.distributed elastic (``torchrun``, see
:mod:`maskops.engine.launcher`), which puts ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and the
rendezvous address in the environment; without them this process is rank 0 of 1. NCCL on
CUDA, gloo on the CPU (which makes multi-process training testable on a CPU-only machine).

Forming the group and every collective are bounded (:class:`GroupTimeouts`): a group that
cannot form, or a rank left waiting for a peer that never comes, fails with an error that
makes torchrun restart the group (or the run fail) instead of waiting forever.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from maskops.device import select_device
from maskops.engine.errors import ProcessGroupError

T = TypeVar("T")


@dataclass(frozen=True)
class GroupTimeouts:
    """How long a rank waits for its peers (both below the backends' 30-minute default)."""

    init_s: float = 300.0
    """To form the group: the ranks of one host start together and torchrun's rendezvous
    has already gathered the hosts, so only their start-up (imports) differs."""
    collective_s: float = 1800.0
    """In one collective: the others wait there while rank 0 evaluates and saves a
    checkpoint between two steps, so it bounds the longest evaluation."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when started by torchrun, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank = int(os.environ["RANK"])
        return rank, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", rank))
    return None


def device_for(local_rank: int, *, gpu_index: int) -> torch.device:
    """``cuda:(gpu_index + local_rank)`` where CUDA is usable, else the CPU (never on a host
    whose GPUs are present but unusable, nor where a GPU is required: see maskops.device)."""
    return select_device(gpu_index + local_rank)


def init_process_group(info: RankInfo, timeouts: GroupTimeouts) -> None:
    """Join the group torchrun set up (``MASTER_ADDR``/``MASTER_PORT`` in the environment).

    Raises:
        ProcessGroupError: the group did not form within ``timeouts.init_s``.
    """
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    if info.device.type == "cuda":
        torch.cuda.set_device(info.device)
    else:
        # N processes share the cores; oversubscribed threads slow every rank down.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world_size))
    try:
        dist.init_process_group(
            backend,
            rank=info.rank,
            world_size=info.world_size,
            timeout=timedelta(seconds=timeouts.init_s),
        )
    except RuntimeError as exc:  # DistError, DistStoreError and gloo's errors included
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProcessGroupError(
            f"rank {info.rank} could not form the group of {info.world_size} ranks at "
            f"{where} within {timeouts.init_s:g} s: {cause}"
        ) from exc
    dist.set_timeout(timedelta(seconds=timeouts.collective_s))


def run_rank(
    fn: Callable[..., T],
    *,
    gpu_index: int,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    timeouts: GroupTimeouts = GroupTimeouts(),
) -> T:
    """Run ``fn(RankInfo, *args, **kwargs)`` as this process's rank: the one torchrun
    assigned (joining its process group within ``timeouts``), else rank 0 of 1."""
    env = torchrun_env()
    rank, size, local_rank = env if env is not None else (0, 1, 0)
    info = RankInfo(rank, size, local_rank, device_for(local_rank, gpu_index=gpu_index))
    if size > 1:
        init_process_group(info, timeouts)
    try:
        return fn(info, *args, **(kwargs or {}))
    finally:
        if size > 1:
            dist.destroy_process_group()
