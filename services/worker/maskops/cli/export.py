"""``maskops export -m MODEL -e SPEC [-o OUT] [--data_type fp32|fp16|int8] ...`` (TAO flags)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import EXIT_OK, CLIError, add_key_argument


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "export",
        help="export a model to ONNX (fp32, fp16, int8 QDQ), validated against PyTorch",
        description=(
            "Export MODEL to ONNX with input 'images' [1, 3, H, W] (RGB 0..1, resized and "
            "padded to the spec's image_size; normalisation is inside the graph) and outputs "
            "boxes, scores, labels, masks (mask probabilities per box), num_detections. The "
            "ONNX is run in onnxruntime on validation images and compared with PyTorch; an "
            "export that disagrees fails. A TensorRT engine is built only where TensorRT and "
            "a GPU exist (elsewhere the Triton service builds it at start)."
        ),
    )
    parser.add_argument("-m", "--model", required=True, type=Path, help="maskops checkpoint")
    parser.add_argument("-e", "--experiment_spec", required=True, type=Path, help="spec file")
    parser.add_argument(
        "-o",
        "--output_file",
        type=Path,
        default=None,
        help="ONNX file to write (default: MODEL's name with .<data_type>.onnx)",
    )
    parser.add_argument("--data_type", choices=("fp32", "fp16", "int8"), default="fp32")
    parser.add_argument(
        "--cal_image_dir",
        type=Path,
        default=None,
        help="int8 calibration images (default: the training shards, training preprocessing)",
    )
    parser.add_argument(
        "--cal_cache_file",
        type=Path,
        default=None,
        help="where to write the int8 calibration scales (JSON; default: OUT with .cal.json)",
    )
    parser.add_argument("--batches", type=int, default=10, help="int8 calibration batches")
    parser.add_argument("--batch_size", type=int, default=8, help="int8 calibration batch size")
    parser.add_argument(
        "--max_batch_size",
        type=int,
        default=16,
        help="most images per serving batch (Triton max_batch_size; DeepStream batch-size)",
    )
    parser.add_argument(
        "--engine_file",
        type=Path,
        default=None,
        help="build a TensorRT engine here (needs the tensorrt package and a GPU)",
    )
    parser.add_argument(
        "--gen_ds_config",
        action="store_true",
        help="also write labels.txt and a DeepStream nvinfer config next to the ONNX",
    )
    parser.add_argument("--gpu_index", type=int, default=0, help="accepted for TAO; unused")
    parser.add_argument("--log_file", type=Path, default=None, help="also append the log here")
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from maskops.cli.common import engine_errors, load_resolved_spec, tee_log
    from maskops.export import ExportError, export_onnx

    spec = load_resolved_spec(args.experiment_spec)
    bad_input: tuple[type[BaseException], ...] = (ExportError, *engine_errors())
    with tee_log(args.log_file) as log:
        try:
            export_onnx(
                args.model,
                spec,
                args.output_file,
                data_type=args.data_type,
                max_batch_size=args.max_batch_size,
                cal_image_dir=args.cal_image_dir,
                cal_cache_file=args.cal_cache_file,
                batches=args.batches,
                batch_size=args.batch_size,
                engine_file=args.engine_file,
                gen_ds_config=args.gen_ds_config,
                log=log,
            )
        except bad_input as exc:
            raise CLIError(str(exc)) from None
        except OSError as exc:
            raise CLIError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    return EXIT_OK
