"""Process-group setup of one rank: one process per device.

Ranks are started by torch.distributed elastic (``torchrun``, see
:mod:`maskops.training.launcher`), which puts ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and the
rendezvous address in the environment; without them this process is rank 0 of 1. NCCL on
CUDA, gloo on the CPU (which makes multi-process training testable on a CPU-only machine).

Forming the group and every collective are bounded (:class:`GroupTimeouts`): a group that
cannot form, or a rank left waiting for a peer that never comes, fails with an error that
makes torchrun restart the group (or the run fail) instead of waiting forever. The ranks
meet during an evaluation on a gloo group of their own (:class:`EvalGroup`), whose bound is
the evaluation's, not a training step's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from maskops.device import select_device
from maskops.training.errors import ProcessGroupError

T = TypeVar("T")


@dataclass(frozen=True)
class GroupTimeouts:
    """How long a rank waits for its peers (both below the backends' 30-minute default)."""

    init_s: float = 300.0
    """To form the group: the ranks of one host start together and torchrun's rendezvous
    has already gathered the hosts, so only their start-up (imports) differs."""
    collective_s: float = 1800.0
    """In one collective of the training group: the others wait there while rank 0 alone
    saves checkpoints and writes its logs between two steps (the evaluation is shared, and
    its waits are on the evaluation group)."""
    evaluation_s: float = 4 * 3600.0
    """In one collective of the evaluation group (:class:`EvalGroup`): a rank that finished
    its shard waits there for the slowest shard, then for rank 0's COCO metrics. It must
    exceed the longest shard on the slowest device a run uses (a 5,000-image validation set
    on CPU ranks takes hours), and long costs nothing in the failures that matter: a rank
    that dies closes its gloo connections and torchrun stops the group at once, so this
    bound only ends a rank that hangs alive."""


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
    set_group_timeout(timedelta(seconds=timeouts.collective_s))


def set_group_timeout(timeout: timedelta) -> None:
    """Set the default group's timeout for the collectives that follow.

    The lock's torch (2.14) has ``torch.distributed.set_timeout``; torch 2.11, what GPU
    hosts may have, has only the same operation as ``distributed_c10d._set_pg_timeout``.
    """
    set_timeout = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    set_timeout(timeout)


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


class EvalGroup:
    """Where the ranks meet during an evaluation: a gloo group of all ranks with the
    :attr:`GroupTimeouts.evaluation_s` bound, beside the training group.

    gloo because object collectives over NCCL need CUDA tensors, and because a wait on it
    is no NCCL collective (those end at the training group's timeout); its own group even
    when training runs on gloo, for its own timeout. Every rank must call each method in
    the same order. With one rank (``group`` None) every method returns at once.
    """

    def __init__(self, group: ProcessGroup | None, rank: int = 0, world_size: int = 1) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size

    @classmethod
    def create(cls, info: RankInfo, timeouts: GroupTimeouts) -> EvalGroup:
        """The group of this run's ranks; every rank calls this at the same point."""
        if info.world_size == 1:
            return cls(None)
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeouts.evaluation_s))
        assert isinstance(group, ProcessGroup), "every rank is a member"
        return cls(group, info.rank, info.world_size)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, obj: T) -> list[T]:
        """On rank 0 each rank's ``obj`` (picklable), in rank order; ``[]`` on the others."""
        if self.group is None:
            return [obj]
        gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, gathered, dst=0, group=self.group)
        return list(gathered) if gathered is not None else []

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank (what the others pass is ignored)."""
        if self.group is None:
            return obj
        holder: list[Any] = [obj]
        dist.broadcast_object_list(holder, src=0, group=self.group)
        result: T = holder[0]
        return result

    @torch.no_grad()
    def share_buffers(self, module: torch.nn.Module) -> None:
        """Give every rank rank 0's buffers of ``module`` (batch-norm running statistics).

        DistributedDataParallel keeps the parameters equal but copies rank 0's buffers to
        the others only at the start of a forward: after a step each rank holds the running
        statistics its own last batch left. Rank 0's are the ones its checkpoint saves, so
        with them every rank evaluates the checkpoint's model (the next step overwrites the
        others' buffers with rank 0's anyway). Sent through the CPU, one tensor per dtype.
        """
        if self.group is None:
            return
        buffers = list(module.buffers())
        for dtype in sorted({b.dtype for b in buffers}, key=str):
            same = [b for b in buffers if b.dtype == dtype]
            flat = torch.cat([b.detach().reshape(-1).cpu() for b in same])
            dist.broadcast(flat, src=0, group=self.group)
            for buffer, value in zip(same, flat.split([b.numel() for b in same]), strict=True):
                buffer.copy_(value.view_as(buffer))

    def all_agree(self, flag: bool) -> bool:
        """Whether ``flag`` is true on every rank: a branch every rank then takes alike."""
        if self.group is None:
            return flag
        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.group)
        return bool(value.item())
