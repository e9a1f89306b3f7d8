"""A maskops checkpoint as the ensemble's network, run eagerly by PyTorch.

The ``torch`` network backend (``torch_network_model.py`` in Triton's python backend), the
in-process reference it is checked against and bench/gpu_serving.py all run this one
forward, so served and in-process detections come from the same code:

- in: ``images`` ``[N, 3, H, W]``, RGB, resized and padded by the preprocess model: uint8
  0..255 (what the served preprocess model hands over: a quarter of the bytes to copy to
  the device, divided by 255 there, bit for bit as on the host) or float32 0..1 (the
  network normalises);
- out: the exported graph's five padded tensors (:mod:`maskops.export.graph`):
  ``boxes`` float32 ``[N, D, 4]``, ``scores`` float32 ``[N, D]``, ``labels`` int64
  ``[N, D]``, ``masks`` float32 ``[N, D, M, M]`` probabilities, ``num_detections`` int32
  ``[N, 1]``, on the network's device.

Precision: ``fp32``; ``bf16`` or ``fp16`` autocast on CUDA; ``auto`` picks bf16 where the
GPU computes it natively (Ampere and later) and fp16 elsewhere on CUDA, fp32 on the CPU
(autocast is for CUDA here: on the CPU it would be slower and less exact). ``fp32`` on
CUDA is IEEE float32, TF32 off for convolutions and matmuls during the forward: the
precision whose answers agree across processes and devices within the export's fp32
tolerances (cuDNN's TF32 default keeps 10 bits of mantissa, as few as fp16).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from maskops.checkpoints.model_file import load_model
from maskops.data.labels import LabelMap
from maskops.serving.placement import PRECISIONS
from maskops.spec.models import ExperimentSpec

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively (CUDA compute capability 8.0 and later)."""
    if device.type != "cuda":
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision the network runs at on ``device``: ``fp32``, ``bf16`` or ``fp16``.

    Raises:
        ValueError: an unknown precision, or bf16/fp16 asked for on the CPU.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
    if precision == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if native_bf16(device) else "fp16"
    if precision != "fp32" and device.type != "cuda":
        raise ValueError(f"precision {precision}: autocast runs on CUDA devices only")
    return precision


@dataclass(frozen=True)
class NetworkInfo:
    """What a checkpoint says the network is (the graph metadata's equivalent)."""

    spec: ExperimentSpec
    label_map: LabelMap
    image_size: tuple[int, int]
    max_detections: int
    mask_resolution: int


class TorchNetwork:
    """A checkpoint in eval mode on ``device`` at ``precision`` (see module doc).

    Heavy: builds the model and moves it to the device. ``channels_last`` stores the
    weights and input in NHWC; ``compile_mode`` compiles the backbone and FPN with
    ``torch.compile`` in that mode for each batch size it meets (``reduce-overhead``: as
    CUDA graphs on a GPU; :meth:`SpecMaskRCNN.compile_backbone`), the first call of each
    size paying the compilation. Both are tuning arms on GPUs, off by default.
    """

    def __init__(
        self,
        checkpoint: Path,
        *,
        device: str | torch.device = "cpu",
        precision: str = "auto",
        channels_last: bool = False,
        compile_mode: str | None = None,
    ) -> None:
        loaded = load_model(checkpoint, map_location="cpu")
        self.device = torch.device(device)
        self.precision = resolve_precision(precision, self.device)
        self.channels_last = channels_last
        model = loaded.model.eval().to(self.device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        if compile_mode is not None:
            model = model.compile_backbone(compile_mode)
        self.model: nn.Module = model
        image_size = loaded.spec.data_config.image_size
        self.info = NetworkInfo(
            spec=loaded.spec,
            label_map=loaded.label_map,
            image_size=(int(image_size[0]), int(image_size[1])),
            max_detections=int(loaded.model.roi_heads.detections_per_img),
            mask_resolution=int(loaded.spec.maskrcnn_config.mrcnn_resolution),
        )

    @torch.inference_mode()
    def __call__(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``images`` ``[N, 3, H, W]`` uint8 or float (any device) -> the five padded
        outputs."""
        # To the device as they are: a uint8 batch is divided there, by the model's
        # transform (``unit_range``).
        images = images.to(self.device, non_blocking=True)
        if images.is_floating_point():
            images = images.float()
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        dtype = AUTOCAST_DTYPES.get(self.precision)
        with (
            torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None),
            exact_float32(enabled=dtype is None and self.device.type == "cuda"),
        ):
            outputs = self.model(list(images))
        return pad_outputs(outputs, self.info.max_detections)


def to_host(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` in host memory, values unchanged: device tensors are all queued for
    copying (into page-locked memory, so no copy waits for the one before), then the
    host waits once for their streams; host tensors come back as they are."""
    copies = [t.to("cpu", non_blocking=True) for t in tensors]
    for device in {t.device for t in tensors if t.is_cuda}:
        torch.cuda.current_stream(device).synchronize()
    return copies


@contextmanager
def exact_float32(*, enabled: bool) -> Iterator[None]:
    """TF32 off for CUDA convolutions and matmuls inside, as before after (process-wide
    flags: a forward on another thread meanwhile runs exact too)."""
    if not enabled:
        yield
        return
    convolutions = torch.backends.cudnn.allow_tf32
    matmuls = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = convolutions
        torch.backends.cuda.matmul.allow_tf32 = matmuls


def pad_outputs(outputs: list[dict[str, torch.Tensor]], rows: int) -> tuple[torch.Tensor, ...]:
    """The eval outputs of N images as the graph's padded tensors (``rows`` = D), float32
    whatever autocast computed in; rows past ``num_detections`` are zero."""
    boxes, scores, labels, masks, counts = [], [], [], [], []
    for out in outputs:
        pad = rows - int(out["scores"].shape[0])
        boxes.append(F.pad(out["boxes"].float(), (0, 0, 0, pad)))
        scores.append(F.pad(out["scores"].float(), (0, pad)))
        labels.append(F.pad(out["labels"].long(), (0, pad)))
        masks.append(F.pad(out["masks"][:, 0].float(), (0, 0, 0, 0, 0, pad)))
        counts.append(rows - pad)
    device = boxes[0].device if boxes else torch.device("cpu")
    return (
        torch.stack(boxes),
        torch.stack(scores),
        torch.stack(labels),
        torch.stack(masks),
        torch.tensor(counts, dtype=torch.int32, device=device).reshape(-1, 1),
    )
