# ruff: noqa: RUF009 - option() is dataclasses.field with the declared metadata
"""What a publish is asked for: the declaration of the publish options, and the one list of
each of its choices (devices, network backends, the torch backend's precisions).

:class:`PublishOptions` is what ``maskops publish`` reads from its flags (built from its
fields, :mod:`maskops.options_schema`); the publish job takes its ``name`` alone (the rest
is the operator's Triton settings, ``maskops_core.settings``). The serving modules
(:mod:`~maskops.serving.placement`, :mod:`~maskops.serving.model_configs`) and the
control plane's settings take the choices from here. Standard library only, so that the
control plane's core imports it without the engine's libraries.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from maskops.options_schema import option
from maskops.serving.protocol import MODEL_NAME_PATTERN

Device = Literal["cpu", "gpu"]
DEVICES: tuple[str, ...] = get_args(Device)
"""Where Triton runs the network (the pre- and post-processing always run on the CPU)."""
NetBackend = Literal["python", "onnxruntime", "tensorrt", "torch"]
NET_BACKENDS: tuple[str, ...] = get_args(NetBackend)
"""How Triton runs the network (:mod:`maskops.serving.repository` says what each serves)."""
Precision = Literal["auto", "fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
"""The torch network backend's precisions: fp32, or bf16/fp16 autocast on GPUs; ``auto``
picks bf16 where the GPU computes it natively (Ampere and later), fp16 on other GPUs and
fp32 on the CPU (maskops.serving.torch_network.resolve_precision)."""

NETWORK_QUEUE_DELAY_US = 2000
"""How long the network's dynamic batcher waits for more requests to fill a batch, in
microseconds (Triton's ``max_queue_delay_microseconds``). It adds up to that much to a
lone request's latency; 0 batches only what is already waiting when an instance is free."""

ENGINE_CACHE_ROOT = "/var/cache/maskops-trt"
"""Where a Triton process keeps the engines onnxruntime-TensorRT builds (as Triton sees
it), one folder per network version (``maskops.serving.placement.engine_cache_folder``).

Local to each Triton process, never in the shared repository: onnxruntime writes a cache
file in place (no temporary file and rename), so replicas sharing a repository, each
building the same engine as it first meets a shape, would write one file at once and
leave a mix of both engines for every later load. Per version, because onnxruntime names
an engine after the graph's structure, not its weights: two versions of one network
share a name. onnxruntime creates only the last level of the path, so the root must
exist (the Triton image's entrypoint makes it; docker-compose.yml gives each replica a
volume of its own there)."""

MODEL_NAME_REST_PATTERN = f"^{MODEL_NAME_PATTERN.pattern}$"
"""A published model's name (the Triton ensemble users call): the engine's rule
(:data:`maskops.serving.protocol.MODEL_NAME_PATTERN`), anchored for JSON Schema."""

IMAGE_LIMITS = "image limits"
"""The argument group of the preprocess model's image limits."""


@dataclass(frozen=True)
class PublishOptions:
    """The publish options (declared: :mod:`maskops.options_schema`); the image limits
    are :class:`maskops.serving.protocol.ImageLimits`' fields."""

    name: str = option(
        dataclasses.MISSING,
        help="the published model's name, the one clients call",
        flag=("-n", "--name"),
        rest=True,
        pattern=MODEL_NAME_REST_PATTERN,
    )
    device: Device = option(
        "cpu",
        help="where Triton runs the network (the pre/post-processing always run on the CPU)",
    )
    gpus: str = option(
        "", help="with --device gpu: GPU ids for the network's instances, e.g. 0,1 (default: all)"
    )
    net_backend: NetBackend | None = option(
        None,
        help="how Triton runs the network: onnxruntime in the python backend (default on "
        "the CPU; the PyPI Triton has only this), Triton's onnxruntime backend (default on "
        "GPUs, with the TensorRT accelerator: Triton builds the engine at load), a "
        "TensorRT engine from `maskops gen_trt_engine` (tensorrt, GPUs only) or the "
        "checkpoint run by PyTorch in the python backend (torch: GPU hosts without "
        "TensorRT, or the CPU)",
    )
    precision: Precision = option(
        "auto",
        help="with --net_backend torch: fp32, or bf16/fp16 autocast on GPUs (auto: bf16 "
        "where the GPU has it natively, else fp16; fp32 on the CPU)",
    )
    engine: Path | None = option(
        None,
        help="with --net_backend tensorrt: the engine (default: MODEL with .engine); its "
        "record (ENGINE.json) must name the TensorRT that Triton runs",
    )
    triton_tensorrt_version: str | None = option(
        None,
        help="the TensorRT of the Triton that serves the engine (default: the version in "
        "the Triton image maskops pins)",
    )
    triton_engine_cache: str = option(
        ENGINE_CACHE_ROOT,
        help="where each Triton process caches the TensorRT engines of --device gpu, as "
        "Triton sees it; it must exist there (default: %(default)s, which maskops' Triton "
        "image makes)",
    )
    max_batch_size: int | None = option(
        None,
        help="the largest batch Triton forms of requests arriving together: the "
        "max_batch_size of every model of the ensemble (default: the export's "
        "--max_batch_size)",
    )
    instances: int = option(
        1,
        help="instances of the network model (processes, for the python and torch "
        "backends), on each GPU with --device gpu",
        ge=1,
    )
    processing_instances: int = option(
        1,
        help="instances of the pre- and post-processing models, each a process on the "
        "CPU: each works through its batches one image at a time, so more instances "
        "decode and encode more images at once",
        ge=1,
    )
    max_queue_delay_us: int = option(
        NETWORK_QUEUE_DELAY_US,
        help="microseconds the network waits for more requests to fill a batch (Triton's "
        "max_queue_delay_microseconds): up to that much more latency for a lone request; "
        "0 batches only the requests already waiting",
        ge=0,
    )
    max_image_pixels: int | None = option(
        None, help="most pixels (width x height) of an image", group=IMAGE_LIMITS
    )
    max_image_side: int | None = option(
        None, help="longest side of an image, in pixels", group=IMAGE_LIMITS
    )
    max_image_aspect: float | None = option(
        None, help="long side / short side of an image", group=IMAGE_LIMITS
    )
