"""``maskops export -m MODEL -e SPEC [-o OUT] [--data_type fp32|fp16|int8] ...`` (TAO flags)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import (
    EXIT_OK,
    MODEL_HELP,
    CLIError,
    add_key_argument,
    model_argument,
    notice,
)
from maskops.export.options import (
    DATA_TYPES,
    DEFAULTS,
    INT8_MIN_OPSET,
    MAX_OPSET,
    MIN_OPSET,
    OUTPUT_LAYOUTS,
    TARGETS,
    ExportOptions,
)

IGNORED_FLAGS: dict[str, str] = {
    "force_ptq": "is implied: maskops never trains quantization-aware models, so int8 is "
    "always post-training quantization",
    "cal_json_file": "is ignored: it carries the tensor scales of QAT models; maskops "
    "calibrates int8 itself (see --cal_cache_file)",
    "cal_data_file": "is ignored: maskops does not read TAO tensorfiles; int8 calibrates on "
    "--cal_image_dir or the training shards",
    "onnx_route": "is ignored: maskops exports with torch.onnx (TAO's choice of keras2onnx "
    "or tf2onnx does not apply)",
}
"""TAO export flags accepted for compatibility, and why each changes nothing here."""

ENGINE_FLAGS = {
    "max_workspace_size": "--max_workspace_size",
    "strict_type_constraints": "-s",
    "min_batch_size": "--min_batch_size",
    "opt_batch_size": "--opt_batch_size",
    "gpu_index": "--gpu_index",
}
"""TensorRT builder flags: they act only when an engine is built here."""


DESCRIPTION = (
    "Export MODEL to ONNX with input 'images' [N, 3, H, W] (a batch of N images, RGB "
    "0..1, resized and padded to the spec's image_size; normalisation is inside the "
    "graph) and outputs boxes, scores, labels, masks (mask probabilities per box), "
    "num_detections, one row per image; with --engine_file or --gen_ds_config (or "
    "--output_layout tao) TAO's input 'Input' (TAO's nvinfer preprocessing: "
    "0.017507 * (pixel - ImageNet offsets)) and outputs generate_detections and "
    "mask_fcn_logits/BiasAdd instead, which DeepStream's TAO Mask R-CNN configs "
    "feed and parse. The "
    "ONNX is run in onnxruntime on validation images and compared with PyTorch; an "
    "export that disagrees fails. A TensorRT engine (--engine_file) is built only "
    "where TensorRT and a GPU exist, with its record ENGINE.json; without one, "
    "`maskops publish --device gpu` serves the ONNX on Triton's onnxruntime backend, "
    "whose TensorRT accelerator builds the engine as the model loads. With --target "
    "tensorrt or --engine_file the graph is checked against TensorRT's ONNX import "
    "rules before anything is written, and int8 uses symmetric int8 activations."
)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "export",
        help="export a model to ONNX (fp32, fp16, int8 QDQ), validated against PyTorch",
        description=DESCRIPTION,
    )
    parser.add_argument("-m", "--model", required=True, type=Path, help=MODEL_HELP)
    parser.add_argument("-e", "--experiment_spec", required=True, type=Path, help="spec file")
    parser.add_argument(
        "-o",
        "--output_file",
        type=Path,
        default=None,
        help="ONNX file to write (default: MODEL's name with .<data_type>.onnx)",
    )
    _add_graph_flags(parser)
    _add_int8_flags(parser)
    _add_batch_flags(parser)
    _add_tensorrt_flags(parser)
    # TAO flags that change nothing here; each prints why when given.
    parser.add_argument("--force_ptq", action="store_true", help=argparse.SUPPRESS)
    for flag in ("cal_json_file", "cal_data_file", "onnx_route"):
        parser.add_argument(f"--{flag}", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--log_file", type=Path, default=None, help="also append the log here")
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def _add_graph_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data_type", choices=DATA_TYPES, default=DEFAULTS.data_type)
    parser.add_argument(
        "--output_layout",
        choices=OUTPUT_LAYOUTS,
        default=DEFAULTS.output_layout,
        help="input and outputs: maskops' (onnxruntime, Triton) or TAO's (TensorRT, "
        "DeepStream); default tao with --engine_file or --gen_ds_config, else maskops",
    )
    parser.add_argument(
        "--gen_ds_config",
        action="store_true",
        help="also write labels.txt and a DeepStream nvinfer config next to the ONNX",
    )
    parser.add_argument(
        "--target_opset",
        type=int,
        default=None,
        help=f"ONNX opset ({MIN_OPSET}..{MAX_OPSET}; int8 needs >= {INT8_MIN_OPSET}; "
        f"default {DEFAULTS.opset})",
    )
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default=DEFAULTS.target,
        help="what the ONNX is for: onnxruntime (portable; int8 with uint8 activations) or "
        "tensorrt (checked against TensorRT's ONNX import rules; int8 symmetric, zero points "
        "0); --engine_file implies tensorrt",
    )


def _add_int8_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cal_image_dir",
        type=Path,
        default=DEFAULTS.cal_image_dir,
        help="int8 calibration images (default: the training shards, training preprocessing)",
    )
    parser.add_argument(
        "--cal_cache_file",
        type=Path,
        default=DEFAULTS.cal_cache_file,
        help="where to write the int8 calibration scales (JSON; default: OUT with .cal.json)",
    )
    parser.add_argument(
        "--batches", type=int, default=DEFAULTS.batches, help="int8 calibration batches"
    )
    parser.add_argument(
        "--batch_size", type=int, default=DEFAULTS.batch_size, help="int8 calibration batch size"
    )


def _add_batch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max_batch_size",
        type=int,
        default=DEFAULTS.max_batch_size,
        help="most images per batch: the graph's batch N is dynamic up to it (Triton "
        "max_batch_size, the TensorRT profile's max, DeepStream batch-size)",
    )
    parser.add_argument(
        "--static_batch_size",
        type=int,
        default=DEFAULTS.static_batch_size,
        help="fix the graph's batch N at this size instead of a dynamic N",
    )
    parser.add_argument(
        "--min_batch_size",
        type=int,
        default=DEFAULTS.min_batch_size,
        help="TensorRT profile's smallest batch (with --engine_file; default 1)",
    )
    parser.add_argument(
        "--opt_batch_size",
        type=int,
        default=DEFAULTS.opt_batch_size,
        help="batch TensorRT tunes for (with --engine_file; default --max_batch_size)",
    )


def _add_tensorrt_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine_file",
        type=Path,
        default=DEFAULTS.engine_file,
        help="build a TensorRT engine here (needs the tensorrt package and a GPU)",
    )
    parser.add_argument(
        "--max_workspace_size",
        type=int,
        default=DEFAULTS.workspace_bytes,
        help="TensorRT builder workspace in bytes (with --engine_file)",
    )
    parser.add_argument(
        "-s",
        "--strict_type_constraints",
        action="store_true",
        help="TensorRT obeys the layer precisions (with --engine_file)",
    )
    parser.add_argument(
        "--gpu_index",
        type=int,
        default=DEFAULTS.gpu_index,
        help="CUDA device that builds the TensorRT engine (with --engine_file); the parity "
        "check runs on the CPU",
    )


def builder_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`ExportOptions` fields the TensorRT and TAO-only flags map to (those
    given, and the ones always passed); a notice for each flag given that changes nothing
    here."""
    from maskops.export.tensorrt import tensorrt_unavailable_reason

    for name, why in IGNORED_FLAGS.items():
        value = getattr(args, name)
        if value not in (None, False, ""):
            notice(f"--{name}", why)
    options: dict[str, Any] = {}
    if args.target_opset is not None:
        options["opset"] = args.target_opset
    given = [f for n, f in ENGINE_FLAGS.items() if getattr(args, n) not in (None, False)]
    if given and args.engine_file is None:
        notice(
            "/".join(given), "changes nothing without --engine_file (no TensorRT engine is built)"
        )
    elif given and (reason := tensorrt_unavailable_reason()) is not None:
        notice("/".join(given), f"changes nothing: no TensorRT engine is built here ({reason})")
    if args.max_workspace_size is not None:
        options["workspace_bytes"] = args.max_workspace_size
    options["strict_types"] = args.strict_type_constraints
    options["target"] = args.target
    options["gpu_index"] = args.gpu_index
    # The batch flags are checked (min <= opt <= max) and reported even with no engine.
    for name in ("static_batch_size", "min_batch_size", "opt_batch_size"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return options


def export_options(args: argparse.Namespace) -> ExportOptions:
    """The :class:`ExportOptions` the flags ask for (notices for flags that change nothing)."""
    return ExportOptions(
        data_type=args.data_type,
        max_batch_size=args.max_batch_size,
        cal_image_dir=args.cal_image_dir,
        cal_cache_file=args.cal_cache_file,
        batches=args.batches,
        batch_size=args.batch_size,
        engine_file=args.engine_file,
        gen_ds_config=args.gen_ds_config,
        output_layout=args.output_layout,
        **builder_options(args),
    )


def run(args: argparse.Namespace) -> int:
    from maskops.cli.common import engine_errors, load_resolved_spec, tee_log
    from maskops.export import ExportError, export_onnx

    args.model = model_argument(args.model)
    spec = load_resolved_spec(args.experiment_spec)
    bad_input: tuple[type[BaseException], ...] = (ExportError, *engine_errors())
    with tee_log(args.log_file) as log:
        try:
            result = export_onnx(args.model, spec, args.output_file, export_options(args), log=log)
        except bad_input as exc:
            raise CLIError(str(exc)) from None
        except OSError as exc:
            raise CLIError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    if result.engine_file is not None:
        from maskops.cli.gen_trt_engine import record_engine

        meta = result.metadata
        record_engine(
            result.engine_file, result.onnx_path, result.data_type, meta.image_size, result.profile
        )
    return EXIT_OK
