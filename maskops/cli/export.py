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
from maskops.cli.options import add_option_flags, flag_of, options_from_args
from maskops.export.options import ExportOptions
from maskops.tasks import EXPORT

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

ENGINE_OPTIONS = (
    "workspace_bytes",
    "strict_types",
    "min_batch_size",
    "opt_batch_size",
    "gpu_index",
)
"""TensorRT builder options: they act only when an engine is built here."""


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
        help=EXPORT.summary,
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
    add_option_flags(parser, ExportOptions)
    # TAO flags that change nothing here; each prints why when given.
    parser.add_argument("--force_ptq", action="store_true", help=argparse.SUPPRESS)
    for flag in ("cal_json_file", "cal_data_file", "onnx_route"):
        parser.add_argument(f"--{flag}", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--log_file", type=Path, default=None, help="also append the log here")
    add_key_argument(parser)
    parser.set_defaults(handler=run)


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
    if args.opset is not None:
        options["opset"] = args.opset
    given = [
        flag_of(ExportOptions, n) for n in ENGINE_OPTIONS if getattr(args, n) not in (None, False)
    ]
    if given and args.engine_file is None:
        notice(
            "/".join(given), "changes nothing without --engine_file (no TensorRT engine is built)"
        )
    elif given and (reason := tensorrt_unavailable_reason()) is not None:
        notice("/".join(given), f"changes nothing: no TensorRT engine is built here ({reason})")
    # The batch flags are checked (min <= opt <= max) and reported even with no engine.
    for name in (*ENGINE_OPTIONS, "static_batch_size"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    options["target"] = args.target
    return options


def export_options(args: argparse.Namespace) -> ExportOptions:
    """The :class:`ExportOptions` the flags ask for (notices for flags that change nothing)."""
    builder_options(args)
    return options_from_args(args, ExportOptions)


def run(args: argparse.Namespace) -> int:
    from maskops.cli.common import engine_errors, load_resolved_spec, tee_log
    from maskops.export import ExportError, export_onnx

    args.model = model_argument(args.model)
    spec = load_resolved_spec(args.experiment_spec)
    bad_input: tuple[type[BaseException], ...] = (ExportError, *engine_errors())
    with tee_log(args.log_file) as log:
        try:
            result = export_onnx(
                args.model, spec, args.output_file, export_options(args), log=log, progress=True
            )
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
