"""The torch network's outputs copied to host memory in one go (``outputs_via_host``)."""

from __future__ import annotations

import pytest
import torch

from maskops.serving.torch_network import to_host


def test_host_tensors_come_back_as_they_are() -> None:
    outputs = (torch.rand(2, 5, 4), torch.arange(4, dtype=torch.int32).reshape(4, 1))
    copies = to_host(outputs)
    assert all(copy is tensor for copy, tensor in zip(copies, outputs, strict=True))


@pytest.mark.gpu
def test_device_tensors_arrive_whole_in_page_locked_memory() -> None:
    """Queued behind a long kernel: a copy read before its stream finished would hold the
    values from before the kernel."""
    big = torch.rand(4096, 4096, device="cuda")
    masks = torch.zeros(8, 100, 28, 28, device="cuda")
    for _ in range(4):
        big = big @ big / 4096  # keeps the stream busy
    masks += big[:1, :1].sum() * 0 + 1
    labels = torch.arange(800, device="cuda").reshape(8, 100)
    copies = to_host([masks, labels])
    assert all(c.device.type == "cpu" and c.is_pinned() for c in copies)
    assert torch.equal(copies[0], torch.ones(8, 100, 28, 28))
    assert torch.equal(copies[1], torch.arange(800).reshape(8, 100))
