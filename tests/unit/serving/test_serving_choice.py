"""Which backend runs where is chosen by one rule and said with its reason."""

from __future__ import annotations

import pytest
import torch

from maskops.serving.placement import choose_serving, torch_cuda_device


def test_tensorrt_first_then_torch_on_cuda_then_the_cpu() -> None:
    trt = choose_serving(tensorrt=True, cuda="H100 (compute capability 9.0)")
    assert (trt.device, trt.net_backend) == ("gpu", "onnxruntime")
    assert "TensorRT present" in trt.reason
    gpu = choose_serving(tensorrt=False, cuda="H100 (compute capability 9.0)")
    assert (gpu.device, gpu.net_backend) == ("gpu", "torch")
    assert "torch on H100 (compute capability 9.0)" in gpu.reason
    cpu = choose_serving(tensorrt=False, cuda=None, no_cuda_why="torch 2.14 sees no CUDA device")
    assert (cpu.device, cpu.net_backend) == ("cpu", "python")
    assert cpu.reason == ("no TensorRT and torch 2.14 sees no CUDA device: onnxruntime on the CPU")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a host without CUDA")
def test_a_host_without_cuda_is_told_why() -> None:
    device, why = torch_cuda_device()
    assert device is None and "sees no CUDA device" in why


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_host_serves_with_torch_on_its_gpu() -> None:
    device, why = torch_cuda_device()
    assert device is not None and "compute capability" in device and why == ""
    assert choose_serving(tensorrt=False, cuda=device).net_backend == "torch"
