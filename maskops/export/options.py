"""What an export makes: the one definition of the export options.

:class:`ExportOptions` is what :func:`maskops.export.export_onnx` takes; the ``maskops
export`` flags (:mod:`maskops.cli.export`, each field's ``flag``) and the REST export job's
options (``maskops_core.options.ExportOptions``, which takes its defaults and choices from
here) are the same fields with the same defaults (tests/unit/export/test_export_options.py
checks all three). Standard library only, so that the control plane's core imports it
without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

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


def export_file_name(model_path: Path, data_type: str) -> str:
    """The file name of ``model_path``'s export in ``data_type``, the one rule for it:
    ``<model stem>.<data_type>.onnx`` (``model.step-4.pth`` in fp16 ->
    ``model.step-4.fp16.onnx``). ``maskops export`` writes it next to the model unless
    ``--output_file`` says otherwise; an export job writes it in its ``export`` folder and
    names it in its result (what publish and a follow-up job read)."""
    return f"{Path(model_path).stem}.{data_type}.onnx"


def _option(default: Any, flag: str | None = None) -> Any:
    """A field whose ``maskops export`` flag is ``flag`` (TAO's name), else ``--<field>``."""
    return field(default=default, metadata={"flag": flag} if flag else {})


@dataclass(frozen=True)
class ExportOptions:
    """The export's options; every one has TAO's ``maskops export`` flag of the same name
    unless ``flag`` says otherwise."""

    data_type: DataType = "fp32"
    """fp32, fp16 or int8 (QDQ)."""
    max_batch_size: int = 16
    """The most images one batch may carry (the graph's batch is dynamic up to it; Triton's
    max_batch_size at publish, DeepStream's batch-size)."""
    static_batch_size: int | None = None
    """Fix the graph's batch at this size instead (it then is the max_batch_size too)."""
    min_batch_size: int | None = None
    """The TensorRT profile's smallest batch (default 1)."""
    opt_batch_size: int | None = None
    """The batch TensorRT tunes for (default max_batch_size)."""
    cal_image_dir: Path | None = None
    """int8 calibration images (default: the training shards, training preprocessing)."""
    cal_cache_file: Path | None = None
    """Where to write the int8 calibration scales (default: next to the ONNX, .cal.json)."""
    batches: int = 10
    """int8 calibration uses ``batches * batch_size`` images."""
    batch_size: int = 8
    engine_file: Path | None = None
    """Build a TensorRT engine here (only where TensorRT and a GPU exist)."""
    gen_ds_config: bool = False
    """Also write labels.txt and a DeepStream nvinfer config next to the ONNX."""
    output_layout: OutputLayout | None = None
    """maskops' or TAO's input and outputs (:mod:`maskops.export.tao_layout`); default tao
    when an engine or DeepStream files are requested, else maskops."""
    opset: int = _option(OPSET, "--target_opset")
    """The ONNX opset, MIN_OPSET..MAX_OPSET; int8 needs INT8_MIN_OPSET or later."""
    workspace_bytes: int | None = _option(None, "--max_workspace_size")
    """TensorRT builder workspace (only when an engine is built)."""
    strict_types: bool = _option(False, "--strict_type_constraints")
    """TensorRT obeys the layer precisions (only when an engine is built)."""
    target: Target = "onnxruntime"
    """onnxruntime (portable) or tensorrt: the graph is checked against TensorRT's import
    rules and int8 is symmetric (zero points 0). An engine_file implies tensorrt."""
    gpu_index: int = 0
    """The CUDA device that builds the engine (the parity check runs on the CPU)."""


def opset_error(opset: int, data_type: str) -> str | None:
    """What is wrong with exporting ``data_type`` at ONNX ``opset`` (None: nothing); the CLI
    and the REST door both ask here."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        return f"maskops exports opsets {MIN_OPSET}..{MAX_OPSET}"
    if data_type == "int8" and opset < INT8_MIN_OPSET:
        return f"int8 needs opset {INT8_MIN_OPSET} or later (per-channel QuantizeLinear)"
    return None


def cli_flag(name: str) -> str:
    """The ``maskops export`` flag of option ``name``."""
    flag: str | None = _FIELDS[name].metadata.get("flag")
    return flag or f"--{name}"


_FIELDS = {f.name: f for f in fields(ExportOptions)}
DEFAULTS = ExportOptions()
"""Every option at its default."""
