"""Where the network model of a published ensemble runs, and how Triton is told.

The device is the operator's decision (``maskops publish --device``, the control plane's
``MASKOPS_TRITON_DEVICE``), never probed: the process that publishes is not the Triton
that serves.

- CPU hosts (the default): the network runs in the python backend on onnxruntime's CPU
  provider (``KIND_CPU``), what the PyPI Triton has.
- GPU hosts: the network runs on Triton's onnxruntime backend with the TensorRT execution
  accelerator (``KIND_GPU``): Triton builds the TensorRT engine itself, with its own
  TensorRT, when the model loads, and hands what TensorRT cannot take to the CUDA provider.
  The precision follows the export (fp32 -> FP32, fp16 -> FP16, the int8 QDQ graph -> INT8,
  whose scales TensorRT takes from the graph); each Triton process caches the engines
  in a folder of its own (:data:`~maskops.serving.publish_options.ENGINE_CACHE_ROOT`), so
  a restart or a reload does not build them again. No explicit shape profile is given:
  onnxruntime would then need one for every dynamic input of every TensorRT subgraph,
  and Mask R-CNN's graph is split around what TensorRT cannot take (its Loop, NMS), whose
  inputs are internal tensors; onnxruntime instead sizes each engine's profile from the
  shapes it meets and widens it (a rebuild, cached) whenever an input falls outside the
  range seen so far: a new batch size, or after the split a new count of proposals or
  detections.
- The python and tensorrt network backends also run ``KIND_GPU`` on GPU hosts (the
  python one on onnxruntime's CUDA provider, see ``triton_models/network/model.py``).

The pre- and post-processing models always run on the CPU (``KIND_CPU``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

# The choices and the cache root are the publish options' (their one home); serving's
# modules and tests name them here too.
from maskops.serving.publish_options import DEVICES as DEVICES
from maskops.serving.publish_options import ENGINE_CACHE_ROOT as ENGINE_CACHE_ROOT
from maskops.serving.publish_options import PRECISIONS as PRECISIONS
from maskops.serving.publish_options import Device as Device

PRECISION_MODES = {"fp32": "FP32", "fp16": "FP16", "int8": "INT8"}
"""The TensorRT accelerator's ``precision_mode`` for each export data type."""
TENSORRT_WORKSPACE_BYTES = 2 << 30
"""TensorRT's builder workspace (``gen_trt_engine``'s default, 2 GiB, as tao-deploy)."""


@dataclass(frozen=True)
class Placement:
    """Where the network runs: ``device`` and, on GPUs, which ones (empty: every GPU
    Triton sees, ``count`` instances on each)."""

    device: Device = "cpu"
    gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r}: expected one of {DEVICES}")
        if self.device == "cpu" and self.gpus:
            raise ValueError("GPUs given for the CPU device")
        if any(g < 0 for g in self.gpus):
            raise ValueError(f"GPU ids must be >= 0, got {list(self.gpus)}")

    @property
    def kind(self) -> str:
        return "KIND_GPU" if self.device == "gpu" else "KIND_CPU"

    def default_net_backend(self) -> str:
        """``onnxruntime`` (with the TensorRT accelerator) on GPUs, ``python`` on CPUs."""
        return "onnxruntime" if self.device == "gpu" else "python"

    def instance_group(self, count: int) -> str:
        """The network's ``instance_group`` line."""
        gpus = f" gpus: [ {', '.join(str(g) for g in self.gpus)} ]" if self.gpus else ""
        return f"instance_group [ {{ kind: {self.kind} count: {count}{gpus} }} ]\n"


def tensorrt_accelerator(data_type: str, *, engine_cache: str | None) -> str:
    """The ``optimization`` block that runs an onnxruntime-backend model on TensorRT.

    Args:
        data_type: the export's (``fp32``, ``fp16``, ``int8``).
        engine_cache: the cache folder as Triton sees it (an absolute path), or None.
    """
    if data_type not in PRECISION_MODES:
        raise ValueError(f"data type {data_type!r}: expected one of {sorted(PRECISION_MODES)}")
    params = {
        "precision_mode": PRECISION_MODES[data_type],
        "max_workspace_size_bytes": str(TENSORRT_WORKSPACE_BYTES),
    }
    if engine_cache is not None:
        params |= {"trt_engine_cache_enable": "1", "trt_engine_cache_path": engine_cache}
    lines = "".join(
        f'      parameters {{ key: "{key}" value: "{value}" }}\n' for key, value in params.items()
    )
    return (
        "optimization { execution_accelerators {\n"
        '  gpu_execution_accelerator : [ {\n    name : "tensorrt"\n'
        f"{lines}  }} ]\n}}}}\n"
    )


def engine_cache_folder(root: str, net_model: str, version: int) -> str:
    """The engine cache of one network version: ``<root>/<net model>.<version>``, one level
    below ``root`` (the only level onnxruntime creates)."""
    return str(PurePosixPath(root) / f"{net_model}.{version}")


def parse_gpus(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"0,2"`` (or a sequence of ints) as ``(0, 2)``; empty: every GPU."""
    if not isinstance(text, str):
        return tuple(int(g) for g in text)
    return tuple(int(part) for part in text.replace(" ", "").split(",") if part)


@dataclass(frozen=True)
class ServingChoice:
    """Where published networks run on a host, and why (said to the operator, never
    silently): ``device``, ``net_backend`` and a one-line ``reason``."""

    device: Device
    net_backend: str
    reason: str


def choose_serving(*, tensorrt: bool, cuda: str | None, no_cuda_why: str = "") -> ServingChoice:
    """The placement rule: TensorRT present -> the onnxruntime backend with the TensorRT
    accelerator (or a ``tensorrt`` plan) on the GPU; else a usable CUDA device that torch
    sees (``cuda``: its description) -> the ``torch`` backend on the GPU; else the CPU
    (onnxruntime in the python backend). ``no_cuda_why`` says why there is no CUDA."""
    if tensorrt:
        why = "TensorRT present: onnxruntime with the TensorRT accelerator on the GPU"
        return ServingChoice("gpu", "onnxruntime", why)
    if cuda:
        return ServingChoice("gpu", "torch", f"no TensorRT; torch on {cuda}: torch on the GPU")
    why = no_cuda_why or "torch sees no CUDA device"
    return ServingChoice("cpu", "python", f"no TensorRT and {why}: onnxruntime on the CPU")


def torch_cuda_device() -> tuple[str | None, str]:
    """(a description of the first CUDA device torch can use, or None; why not)."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} sees no CUDA device"
    try:
        name = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
    except RuntimeError as exc:  # a driver that fails on first use
        return None, f"CUDA device 0 is not usable ({exc})"
    return f"{name} (compute capability {major}.{minor})", ""
