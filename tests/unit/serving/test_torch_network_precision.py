"""The torch network backend's fp32: IEEE float32 on CUDA, whatever the process's TF32 flags."""

from __future__ import annotations

import pytest
import torch

from maskops.serving.torch_network import exact_float32


@pytest.mark.parametrize("before", [True, False])
def test_exact_float32_turns_tf32_off_inside_and_restores_the_flags(before: bool) -> None:
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = before
    try:
        with exact_float32(enabled=True):
            assert not torch.backends.cudnn.allow_tf32
            assert not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32 is before
        assert torch.backends.cuda.matmul.allow_tf32 is before
        with exact_float32(enabled=False):  # autocast's precisions leave them alone
            assert torch.backends.cudnn.allow_tf32 is before
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
