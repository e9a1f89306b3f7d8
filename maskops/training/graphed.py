"""The backbone and FPN replayed as CUDA graphs in training (``DeviceTuning.graphed_backbone``).

A training step on a GPU is bound by the host when each of the hundreds of kernels of a
ResNet-50 and its FPN is launched one by one, forward and backward. TAO's ``image_size``
is fixed, so their shapes are the same at every step: :func:`graph_backbone` captures the
forward and the backward once (``torch.cuda.make_graphed_callables``), and each step then
launches each as one graph. Parameter names, checkpoints and the optimizer are unchanged:
the module stays where it is, only its ``forward`` is replaced.

The graphs are used only for what they captured: a training-mode forward with gradients
on, every submodule in the mode it had at capture, and an input of the captured shape,
type, strides and device. Anything else (evaluation, the validation loss's eval-mode
batch norm, a smaller batch) runs the eager forward.

Capturing runs a few eager forward and backward passes on a zero batch; the batch-norm
statistics they would change are put back, so the run trains as it would eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

WARMUP_ITERATIONS = 3
"""Eager passes before the capture (``make_graphed_callables``' default): cuDNN and the
allocator settle on what the graphs then hold."""


def _signature(images: Tensor) -> tuple[Any, ...]:
    return (tuple(images.shape), images.dtype, images.stride(), images.device)


def graph_backbone(
    backbone: nn.Module,
    *,
    batch_shape: tuple[int, int, int, int],
    memory_format: torch.memory_format,
    autocast_dtype: torch.dtype | None,
) -> None:
    """Capture ``backbone``'s training forward and backward for float32 image batches of
    ``batch_shape`` (``[B, 3, H, W]``, as the model's transform hands them over, in
    ``memory_format``) under autocast to ``autocast_dtype`` (None: fp32); in place.

    Raises:
        RuntimeError: ``backbone`` is not on a CUDA device, or is not in training mode.
    """
    parameter = next(backbone.parameters())
    if parameter.device.type != "cuda" or not backbone.training:
        raise RuntimeError("graph_backbone: a training-mode backbone on a CUDA device expected")
    sample = torch.zeros(batch_shape, device=parameter.device)
    sample = sample.contiguous(memory_format=memory_format)
    eager_forward: Callable[..., Any] = backbone.forward
    modes = [module.training for module in backbone.modules()]
    saved = [buffer.detach().clone() for buffer in backbone.buffers()]
    # Autocast's weight cache would hold casts made during the capture: graphs need it off.
    with torch.autocast(
        "cuda",
        dtype=autocast_dtype or torch.float16,
        enabled=autocast_dtype is not None,
        cache_enabled=False,
    ):
        torch.cuda.make_graphed_callables(
            backbone, (sample,), num_warmup_iters=WARMUP_ITERATIONS, allow_unused_input=True
        )
    with torch.no_grad():
        for buffer, value in zip(backbone.buffers(), saved, strict=True):
            buffer.copy_(value)
    graphed_forward: Callable[..., Any] = backbone.forward
    captured = _signature(sample)

    def forward(images: Tensor) -> Any:
        if (
            torch.is_grad_enabled()
            and _signature(images) == captured
            and [module.training for module in backbone.modules()] == modes
        ):
            return graphed_forward(images)
        return eager_forward(images)

    backbone.forward = forward
