"""Copy the next training batch to the GPU on a side CUDA stream while the current step runs.

Without it the trainer copies each batch at the start of its step on the compute stream,
so the step's first kernels queue behind the host-to-device copies of its images and
masks. :class:`DevicePrefetcher` issues the copy of batch ``k + 1`` on its own stream as
soon as batch ``k`` is handed out; the copy engine then runs beside step ``k``'s kernels.

Stream rules (as in PyTorch's "CUDA semantics" notes on non-default streams):

* the compute stream waits for the copy stream (``wait_stream``) before a prefetched
  batch is used, so no kernel reads a tensor whose copy has not finished;
* every tensor of the batch is marked as used by the compute stream (``record_stream``):
  the caching allocator gave its memory to the copy stream, and without the mark it could
  hand that memory to the next copy as soon as the Python tensor is freed, while step
  ``k``'s kernels are still reading it;
* the host tensors must be pinned (the loader's ``pin_memory``): a ``non_blocking`` copy
  from pageable memory is synchronous, and then nothing overlaps. Pinned host memory
  freed before its copy ends is not reused early: PyTorch's pinned allocator records the
  copy's stream and waits for it.

On a CPU (or any device without CUDA streams) the prefetcher only moves each batch with
:func:`move_batch`, in order: the batches are the same objects
the trainer would have moved itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

Batch = tuple[list[torch.Tensor], list[dict[str, Any]]]
"""Images (float ``[3, H, W]`` in 0..1, or uint8 in 0..255, already resized and padded) and
torchvision targets."""


def batch_tensors(batch: Batch) -> list[torch.Tensor]:
    """Every tensor of ``batch``: its images, then each target's tensor values."""
    images, targets = batch
    return [*images, *(v for t in targets for v in t.values() if isinstance(v, torch.Tensor))]


def move_batch(batch: Batch, device: torch.device) -> Batch:
    """``batch`` with every tensor on ``device`` (``non_blocking``: asynchronous from pinned
    memory); other target values, such as ``image_id``, as they are."""
    images, targets = batch
    moved = [img.to(device, non_blocking=True) for img in images]
    moved_targets = [
        {
            k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in t.items()
        }
        for t in targets
    ]
    return moved, moved_targets


class DevicePrefetcher(Iterator[Batch]):
    """Batches of ``source`` on ``device``, each copied one step ahead on a side stream.

    ``source`` is read one batch ahead of the consumer: when batch ``k`` is returned,
    batch ``k + 1`` has been taken from ``source`` and its copy issued. On a device other
    than CUDA nothing is read ahead and each batch is moved as it is asked for.

    Args:
        source: host batches (pinned, for the copy to overlap on CUDA).
        device: the training device.
    """

    def __init__(self, source: Iterator[Batch], device: torch.device) -> None:
        self.source = source
        self.device = device
        self.stream: torch.cuda.Stream | None = (
            torch.cuda.Stream(device=device) if device.type == "cuda" else None
        )
        self._next: Batch | None = None
        self._started = False

    def __iter__(self) -> DevicePrefetcher:
        return self

    def __next__(self) -> Batch:
        if self.stream is None:
            return move_batch(next(self.source), self.device)
        if not self._started:
            self._started = True
            self._preload()
        if self._next is None:
            raise StopIteration
        compute = torch.cuda.current_stream(self.device)
        compute.wait_stream(self.stream)
        batch = self._next
        for tensor in batch_tensors(batch):
            tensor.record_stream(compute)
        self._preload()
        return batch

    def _preload(self) -> None:
        """Take the next host batch and issue its copy on the side stream (None at the
        source's end)."""
        assert self.stream is not None
        try:
            host = next(self.source)
        except StopIteration:
            self._next = None
            return
        with torch.cuda.stream(self.stream):
            self._next = move_batch(host, self.device)
