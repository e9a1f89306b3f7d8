"""The torch network with its backbone compiled: the serving check's compile arms
(bench/gpu_serving.py ``EAGER_ARMS``) must measure a network that answers as the eager one."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskops.serving.torch_network import TorchNetwork
from tests.support.bench import load_bench_module


def test_an_unknown_compile_mode_is_refused_when_the_network_is_built(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match=r"'fast' is not a torch\.compile mode"):
        TorchNetwork(tiny_checkpoint, compile_mode="fast")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_compiled_backbone_detects_as_the_eager_one_on_a_gpu(trained_model, mode: str) -> None:
    """fp32 (TF32 off), compared by the export's parity rules within fp32's tolerances."""
    gpu_serving = load_bench_module("gpu_serving")
    files = sorted(Path(trained_model.dataset.val_images).glob("*.jpg"))[:4]
    images = [path.read_bytes() for path in files]
    eager = TorchNetwork(trained_model.checkpoint, device="cuda:0", precision="fp32")
    compiled = TorchNetwork(
        trained_model.checkpoint, device="cuda:0", precision="fp32", compile_mode=mode
    )
    reference = gpu_serving.in_process(eager, images)
    for _ in range(3):  # CUDA graphs are recorded at a later call than the first
        answers = gpu_serving.in_process(compiled, images)
    report = gpu_serving.parity(answers, reference, "fp32")
    assert report.passed, report.to_json()
