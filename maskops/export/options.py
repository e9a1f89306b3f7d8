# ruff: noqa: RUF009 - option() is dataclasses.field with the declared metadata
"""What an export makes: the declaration of the export options.

:class:`ExportOptions` is what :func:`maskops.export.export_onnx` takes; the ``maskops
export`` flags and the REST export job's options are built from its fields
(:mod:`maskops.options_schema`). Standard library only, so that the control plane's core
imports it without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from maskops.options_schema import option

DataType = Literal["fp32", "fp16", "int8"]
DATA_TYPES: tuple[str, ...] = get_args(DataType)
OutputLayout = Literal["maskops", "tao"]
OUTPUT_LAYOUTS: tuple[str, ...] = get_args(OutputLayout)
Target = Literal["onnxruntime", "tensorrt"]
TARGETS: tuple[str, ...] = get_args(Target)
"""What the graph is for: onnxruntime (portable; uint8 int8) or TensorRT (checked against
its import rules; symmetric int8). Requesting an engine implies "tensorrt"."""

OPSET = 17
"""The default ONNX opset (``--target_opset`` chooses another in MIN_OPSET..MAX_OPSET)."""
MIN_OPSET = 11
"""The oldest opset the graph traces to (RoiAlign, NonMaxSuppression); int8 needs 13."""
MAX_OPSET = 20
"""The newest opset torch.onnx's TorchScript exporter writes."""
INT8_MIN_OPSET = 13
MAX_BATCH = 1024
"""The largest batch an export job may ask for."""


def export_file_name(model_path: Path, data_type: str) -> str:
    """The file name of ``model_path``'s export in ``data_type``, the one rule for it:
    ``<model stem>.<data_type>.onnx`` (``model.step-4.pth`` in fp16 ->
    ``model.step-4.fp16.onnx``). ``maskops export`` writes it next to the model unless
    ``--output_file`` says otherwise; an export job writes it in its ``export`` folder and
    names it in its result (what publish and a follow-up job read)."""
    return f"{Path(model_path).stem}.{data_type}.onnx"


@dataclass(frozen=True)
class ExportOptions:
    """The export's options (declared: :mod:`maskops.options_schema`)."""

    data_type: DataType = option("fp32", help="fp32, fp16 or int8 (QDQ)", rest=True)
    max_batch_size: int = option(
        16,
        help="most images per batch: the graph's batch N is dynamic up to it (Triton "
        "max_batch_size, the TensorRT profile's max, DeepStream batch-size)",
        rest=True,
        ge=1,
        le=MAX_BATCH,
    )
    static_batch_size: int | None = option(
        None,
        help="fix the graph's batch N at this size instead of a dynamic N (it is then the "
        "max_batch_size too)",
        rest=True,
        ge=1,
        le=MAX_BATCH,
    )
    min_batch_size: int | None = option(
        None,
        help="TensorRT profile's smallest batch (with an engine; default 1)",
        rest=True,
        ge=1,
        le=MAX_BATCH,
    )
    opt_batch_size: int | None = option(
        None,
        help="batch TensorRT tunes for (with an engine; default max_batch_size)",
        rest=True,
        ge=1,
        le=MAX_BATCH,
    )
    cal_image_dir: Path | None = option(
        None,
        help="int8 calibration images (default: the training shards, training preprocessing)",
        rest=True,
    )
    cal_cache_file: Path | None = option(
        None,
        help="where to write the int8 calibration scales (JSON; default: next to the ONNX, "
        ".cal.json)",
    )
    batches: int = option(
        10,
        help="int8 calibration batches (batches * batch_size images)",
        rest=True,
        ge=1,
        le=10_000,
    )
    batch_size: int = option(8, help="int8 calibration batch size", rest=True, ge=1, le=MAX_BATCH)
    engine_file: Path | None = option(
        None, help="build a TensorRT engine here (needs the tensorrt package and a GPU)"
    )
    gen_ds_config: bool = option(
        False,
        help="also write labels.txt and a DeepStream nvinfer config next to the ONNX",
        rest=True,
    )
    output_layout: OutputLayout | None = option(
        None,
        help="the ONNX input and outputs: maskops' (onnxruntime, Triton) or TAO's (TensorRT, "
        "DeepStream: input 'Input' with TAO's nvinfer preprocessing, outputs "
        "generate_detections, mask_fcn_logits/BiasAdd); default tao with an engine or "
        "gen_ds_config, else maskops (maskops.export.tao_layout)",
        rest=True,
    )
    opset: int = option(
        OPSET,
        help=f"ONNX opset ({MIN_OPSET}..{MAX_OPSET}; int8 needs >= {INT8_MIN_OPSET}; "
        f"default {OPSET})",
        flag="--target_opset",
        rest=True,
        ge=MIN_OPSET,
        le=MAX_OPSET,
        # Unset on the command line: only a given --target_opset reaches export_onnx.
        cli_default=None,
    )
    workspace_bytes: int | None = option(
        None,
        help="TensorRT builder workspace in bytes (with an engine)",
        flag="--max_workspace_size",
    )
    strict_types: bool = option(
        False,
        help="TensorRT obeys the layer precisions (with an engine)",
        flag=("-s", "--strict_type_constraints"),
    )
    target: Target = option(
        "onnxruntime",
        help="what the ONNX is for: onnxruntime (portable; int8 with uint8 activations) or "
        "tensorrt (checked against TensorRT's ONNX import rules; int8 symmetric, zero points "
        "0, what Triton's TensorRT backend and accelerator import); an engine or the tao "
        "output_layout implies tensorrt",
        rest=True,
    )
    gpu_index: int = option(
        0,
        help="CUDA device that builds the TensorRT engine (with an engine); the parity "
        "check runs on the CPU",
    )


def opset_error(opset: int, data_type: str) -> str | None:
    """What is wrong with exporting ``data_type`` at ONNX ``opset`` (None: nothing); the CLI
    and the REST door both ask here."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        return f"maskops exports opsets {MIN_OPSET}..{MAX_OPSET}"
    if data_type == "int8" and opset < INT8_MIN_OPSET:
        return f"int8 needs opset {INT8_MIN_OPSET} or later (per-channel QuantizeLinear)"
    return None


DEFAULTS = ExportOptions()
"""Every option at its default."""
