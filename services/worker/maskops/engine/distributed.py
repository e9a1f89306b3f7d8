"""Process-group setup for ``--gpus N``: one process per device.

Under torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment) this process is
one rank of the job. Otherwise ``launch`` starts ranks 1..N-1 with the ``spawn`` start
method and runs rank 0 in the calling process, so that rank 0's hooks (cancellation flags
of the Celery task, for instance) and its return value stay in the caller. NCCL on CUDA,
gloo on the CPU (which makes multi-process training testable on a CPU-only machine).
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

T = TypeVar("T")


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
    """``cuda:(gpu_index + local_rank)`` where CUDA exists, else the CPU."""
    if torch.cuda.is_available():
        index = gpu_index + local_rank
        if index >= torch.cuda.device_count():
            raise RuntimeError(
                f"GPU {index} requested (gpu_index {gpu_index} + rank {local_rank}) but only "
                f"{torch.cuda.device_count()} GPUs are visible"
            )
        return torch.device("cuda", index)
    return torch.device("cpu")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def init_process_group(info: RankInfo, *, init_method: str | None) -> None:
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    if info.device.type == "cuda":
        torch.cuda.set_device(info.device)
    else:
        # N processes share the cores; oversubscribed threads slow every rank down.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world_size))
    dist.init_process_group(
        backend, init_method=init_method or "env://", rank=info.rank, world_size=info.world_size
    )


def _child(
    local_rank: int,
    fn: Callable[..., Any],
    world_size: int,
    gpu_index: int,
    init_method: str,
    args: tuple[Any, ...],
) -> None:
    # Ctrl-C reaches the whole process group: only rank 0 decides to stop (and the ranks
    # agree at the next step boundary), so a terminal interrupt stops the job cleanly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rank = local_rank + 1
    info = RankInfo(rank, world_size, rank, device_for(rank, gpu_index=gpu_index))
    init_process_group(info, init_method=init_method)
    try:
        fn(info, *args)
    finally:
        dist.destroy_process_group()


def launch(
    fn: Callable[..., T],
    *,
    world_size: int,
    gpu_index: int,
    args: tuple[Any, ...] = (),
    main_kwargs: dict[str, Any] | None = None,
) -> T:
    """Run ``fn(RankInfo, *args)`` on every rank and return rank 0's (or this rank's) result.

    ``fn`` and ``args`` must be picklable when ``world_size > 1`` (they go to the spawned
    ranks); ``main_kwargs`` reach only the in-process call and need not be (hooks holding
    events or connections). A failed child makes the parent raise.
    """
    kwargs = main_kwargs or {}
    env = torchrun_env()
    if env is not None:
        rank, size, local_rank = env
        info = RankInfo(rank, size, local_rank, device_for(local_rank, gpu_index=gpu_index))
        if size > 1:
            init_process_group(info, init_method=None)
        try:
            return fn(info, *args, **kwargs)
        finally:
            if size > 1:
                dist.destroy_process_group()
    if world_size == 1:
        return fn(RankInfo(0, 1, 0, device_for(0, gpu_index=gpu_index)), *args, **kwargs)

    init_method = f"tcp://127.0.0.1:{_free_port()}"
    context = mp.start_processes(
        _child,
        args=(fn, world_size, gpu_index, init_method, args),
        nprocs=world_size - 1,
        join=False,
        start_method="spawn",
    )
    info = RankInfo(0, world_size, 0, device_for(0, gpu_index=gpu_index))
    previous_threads = torch.get_num_threads()
    init_process_group(info, init_method=init_method)
    try:
        result = fn(info, *args, **kwargs)
    except BaseException as exc:
        # A failed child usually surfaces on rank 0 as a broken connection: prefer the
        # child's own error, and never leave ranks blocked in a collective.
        try:
            context.join(timeout=5)
        except mp.ProcessRaisedException as child_exc:
            raise RuntimeError(f"a training rank failed: {child_exc}") from exc
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                process.join()
        raise
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(previous_threads)
    # join() raises ProcessRaisedException naming the failed rank and its traceback.
    while not context.join():
        pass
    return result
