"""``maskops inference -i IMAGE_DIR (-o OUT_IMAGE_DIR | -r RESULTS_DIR) -e SPEC -m MODEL
[-l OUT_LABEL_DIR] [-c CLASS_MAP] [--annotations FILE] [-t THRESHOLD] [--include_mask]``.

TAO 5.3 writes ``RESULTS_DIR/images_annotated`` and ``RESULTS_DIR/labels``; ``-r`` does the
same, ``-o`` / ``-l`` name either directory explicitly.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import (
    EXIT_OK,
    CLIError,
    add_key_argument,
    add_model_argument,
    add_spec_argument,
    engine_errors,
    load_resolved_spec,
    model_argument,
)
from maskops.cli.options import add_option_flags, options_from_args
from maskops.evaluation.inference_options import InferenceOptions
from maskops.tasks import INFERENCE

ANNOTATED_DIR = "images_annotated"
LABEL_DIR = "labels"
EXPORT_DIR = "exports"
"""Where ``--export`` writes: RESULTS_DIR/exports (with -l only: beside the label directory)."""


def _threshold(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {text}")
    return value


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "inference",
        help=INFERENCE.summary,
        description=(
            "Run MODEL on every JPEG/PNG in IMAGE_DIR (EXIF orientation respected; unreadable "
            "files are reported and skipped) and write annotated copies to OUT_IMAGE_DIR: "
            "boxes, class names and scores, plus instance masks with --include_mask. With -l "
            "(or -r), also write per-image COCO results JSON (<stem>.json) and "
            "coco_images.json; image ids come from the annotation file (--annotations, "
            "default data_config.val_json_file) for the images it lists, else from the "
            "file names."
        ),
    )
    parser.add_argument("-i", "--image_dir", required=True, type=Path, help="input images")
    parser.add_argument(
        "-o",
        "--out_image_dir",
        type=Path,
        default=None,
        help=f"annotated images (default: RESULTS_DIR/{ANNOTATED_DIR})",
    )
    parser.add_argument(
        "-r",
        "--results_dir",
        type=Path,
        default=None,
        help=f"TAO's output directory: {ANNOTATED_DIR}/ and {LABEL_DIR}/ are written there",
    )
    add_spec_argument(parser)
    add_model_argument(parser)
    parser.add_argument(
        "-l",
        "--out_label_dir",
        type=Path,
        default=None,
        help=f"COCO results JSON directory (default: RESULTS_DIR/{LABEL_DIR}, else none)",
    )
    parser.add_argument(
        "-c",
        "--class_map",
        type=Path,
        default=None,
        help="TAO label file: line k names model class k (the label map's order)",
    )
    add_option_flags(parser, InferenceOptions, types={"threshold": _threshold})
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def output_dirs(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """(annotated image directory, label directory or None) for the parsed flags."""
    results = args.results_dir
    if args.out_image_dir is None and results is None:
        raise CLIError("one of -o/--out_image_dir or -r/--results_dir is required")
    images = args.out_image_dir or results / ANNOTATED_DIR
    labels = args.out_label_dir or (results / LABEL_DIR if results is not None else None)
    return images, labels


def inference_options(args: argparse.Namespace) -> InferenceOptions:
    """The :class:`InferenceOptions` the flags ask for."""
    return options_from_args(args, InferenceOptions)


def run(args: argparse.Namespace) -> int:
    from maskops.evaluation.inference import read_class_map, run_inference

    args.model = model_argument(args.model)
    spec = load_resolved_spec(args.experiment_spec)
    out_images, labels = output_dirs(args)
    options = inference_options(args)
    try:
        run_inference(
            spec,
            args.model,
            args.image_dir,
            out_images,
            options,
            label_dir=labels,
            class_names=read_class_map(args.class_map) if args.class_map else None,
        )
        if options.exports:
            _export(args, options, labels)
    except engine_errors() as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    return EXIT_OK


def _export(args: argparse.Namespace, options: InferenceOptions, labels: Path | None) -> None:
    from maskops.data.formats.predictions import export_predictions

    if labels is None:
        raise CLIError("--export needs -l/--out_label_dir or -r/--results_dir")
    out = (args.results_dir or labels.parent) / EXPORT_DIR
    written = export_predictions(
        labels,
        out,
        sorted(set(options.exports)),
        tolerance=options.polygon_tolerance,
        model_version=options.model_version or "maskops",
    )
    for path in written:
        print(f"wrote {path}")
