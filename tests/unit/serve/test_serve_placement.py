"""`maskops serve` chooses where published networks run once, at start, and says why."""

from __future__ import annotations

import pytest
import torch

from maskops_core.settings import Settings
from maskops_serve.embedded import with_serving_choice


@pytest.mark.skipif(torch.cuda.is_available(), reason="a host without CUDA")
def test_a_host_without_cuda_serves_on_the_cpu_and_says_why() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    chosen, choice = with_serving_choice(settings)
    assert chosen == settings and choice.device == "cpu"
    assert choice.reason.startswith("no TensorRT and torch") and "CPU" in choice.reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_host_serves_on_the_gpu_with_torch_with_no_flag() -> None:
    chosen, choice = with_serving_choice(Settings(_env_file=None))  # type: ignore[call-arg]
    assert (chosen.triton_device, chosen.triton_net_backend) == ("gpu", "torch")
    assert "torch on" in choice.reason
