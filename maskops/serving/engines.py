"""TensorRT engines for Triton's ``tensorrt_plan`` backend: the record kept next to an
engine, and the checks publish makes before serving one.

A serialized TensorRT engine (a "plan") loads only in the TensorRT version that built it
(and on the GPU architecture it was built for), so an engine is served only with the
record that ``maskops gen_trt_engine`` / ``maskops export --engine_file`` write next to it,
``<engine file name>.json``::

    {"tensorrt_version": "10.7.0.23", "onnx_sha256": "<hex of the ONNX it was built from>",
     "engine_sha256": "<hex of the engine itself>", "data_type": "fp16",
     "image_size": [H, W], "profile": {"min": 1, "opt": 8, "max": 8},
     "gpu": "NVIDIA H100 80GB HBM3 (sm_90)"}

:func:`check_engine` compares the record with the engine beside it, with the ONNX being
published and with the TensorRT version of the Triton that will load it
(:data:`TRITON_TENSORRT_VERSION` unless the operator says otherwise). The engine and then
its record are each replaced in one rename, so a build that dies between the two leaves
a new engine beside the old record, which the engine's hash refuses. Nothing here
imports TensorRT, except :func:`builder_facts`, called where an engine was just built.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from maskops.atomic import atomic_write

TRITON_IMAGE_TAG = "24.12"
"""The ``nvcr.io/nvidia/tritonserver:<tag>-py3`` image services/triton/Dockerfile builds on."""
TRITON_TENSORRT_VERSION = "10.7.0.23"
"""The TensorRT inside that image (NVIDIA's release notes of Triton 24.12: TensorRT
10.7.0.23, CUDA 12.6.3): the default version a published engine must have been built with."""


class EngineError(ValueError):
    """No usable engine: missing, without its record, or not for this ONNX or Triton."""


@dataclass(frozen=True)
class EngineRecord:
    """What was known when an engine was built (the JSON next to it)."""

    tensorrt_version: str
    onnx_sha256: str
    engine_sha256: str
    data_type: str
    image_size: tuple[int, int]
    profile: dict[str, int]
    """The batch sizes of the ``images`` optimisation profile: ``min``, ``opt``, ``max``."""
    gpu: str = ""

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["image_size"] = list(self.image_size)
        return record


def record_path(engine: Path) -> Path:
    """``<engine>.json``, next to the engine."""
    return engine.with_name(engine.name + ".json")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def builder_facts() -> tuple[str, str]:
    """``(TensorRT version, GPU name and architecture)`` of this process: where an engine
    was just built (needs the tensorrt package and a CUDA GPU)."""
    import tensorrt
    import torch

    major, minor = torch.cuda.get_device_capability()
    return str(tensorrt.__version__), f"{torch.cuda.get_device_name()} (sm_{major}{minor})"


def write_engine_record(
    engine: Path,
    *,
    onnx_path: Path,
    data_type: str,
    image_size: tuple[int, int],
    profile: tuple[int, int, int],
    tensorrt_version: str,
    gpu: str = "",
) -> Path:
    """Write the record of ``engine`` (built from ``onnx_path``); return its path.

    ``profile`` is ``(min, opt, max)`` batch sizes of the engine's optimisation profile.
    """
    record = EngineRecord(
        tensorrt_version=tensorrt_version,
        onnx_sha256=file_sha256(onnx_path),
        engine_sha256=file_sha256(engine),
        data_type=data_type,
        image_size=(int(image_size[0]), int(image_size[1])),
        profile=dict(zip(("min", "opt", "max"), profile, strict=True)),
        gpu=gpu,
    )
    return atomic_write(record_path(engine), json.dumps(record.to_json(), indent=1))


def read_engine_record(engine: Path) -> EngineRecord:
    """The record next to ``engine``.

    Raises:
        EngineError: no engine, no record, or an unreadable one.
    """
    if not engine.is_file():
        raise EngineError(f"{engine}: no such TensorRT engine file")
    path = record_path(engine)
    try:
        raw = json.loads(path.read_text())
        return EngineRecord(
            tensorrt_version=str(raw["tensorrt_version"]),
            onnx_sha256=str(raw["onnx_sha256"]),
            engine_sha256=str(raw["engine_sha256"]),
            data_type=str(raw["data_type"]),
            image_size=(int(raw["image_size"][0]), int(raw["image_size"][1])),
            profile={k: int(raw["profile"][k]) for k in ("min", "opt", "max")},
            gpu=str(raw.get("gpu", "")),
        )
    except FileNotFoundError:
        raise EngineError(
            f"{engine}: no record of the TensorRT version that built it ({path.name} is "
            "missing); build the engine with `maskops gen_trt_engine`, which writes it"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise EngineError(
            f"{path}: unreadable engine record ({type(exc).__name__}: {exc}); rebuild the "
            "engine with `maskops gen_trt_engine`, which writes it"
        ) from None


def same_tensorrt(built: str, runtime: str) -> bool:
    """Whether an engine built by TensorRT ``built`` loads in TensorRT ``runtime``.

    Plans are tied to the exact release: major.minor.patch must be equal, and the build
    number too when both versions name one (``10.7.0`` matches ``10.7.0.23``); a
    packaging suffix such as ``post1`` is not part of TensorRT's version.
    """
    a, b = ([p for p in v.strip().split(".") if p.isdigit()] for v in (built, runtime))
    if len(a) < 3 or len(b) < 3:
        return False
    shared = min(len(a), len(b))
    return a[:shared] == b[:shared]


def check_engine(
    engine: Path,
    *,
    onnx_path: Path,
    triton_tensorrt_version: str,
    max_batch_size: int,
) -> EngineRecord:
    """The engine's record, once it is known to serve ``onnx_path`` in a Triton whose
    TensorRT is ``triton_tensorrt_version`` at batches 1..``max_batch_size``.

    Raises:
        EngineError: why it cannot (each message names the way out).
    """
    record = read_engine_record(engine)
    if record.engine_sha256 != file_sha256(engine):
        raise EngineError(
            f"{engine} is not the engine its record describes (it changed after the record "
            "was written, or its build did not finish); rebuild it with `maskops gen_trt_engine`"
        )
    if not same_tensorrt(record.tensorrt_version, triton_tensorrt_version):
        raise EngineError(
            f"{engine} was built by TensorRT {record.tensorrt_version} but Triton runs "
            f"TensorRT {triton_tensorrt_version}: a TensorRT engine loads only in the version "
            "that built it. Rebuild it with `maskops gen_trt_engine` in the Triton image's "
            "TensorRT, or set MASKOPS_TRITON_TENSORRT_VERSION to the TensorRT of the Triton "
            "you run, or publish with the onnxruntime backend (Triton builds the engine itself)"
        )
    if record.onnx_sha256 != file_sha256(onnx_path):
        raise EngineError(
            f"{engine} was not built from {onnx_path} (its record names another ONNX); "
            "rebuild it from this export"
        )
    low, high = record.profile["min"], record.profile["max"]
    if low != 1 or high < max_batch_size:
        raise EngineError(
            f"{engine}: its profile serves batches {low}..{high}, Triton batches "
            f"1..{max_batch_size}; rebuild with --min_batch_size 1 --max_batch_size "
            f"{max_batch_size} or publish with --max_batch_size {high}"
        )
    return record
