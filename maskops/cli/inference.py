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
from maskops.evaluation.inference_options import DEFAULTS, InferenceOptions

ANNOTATED_DIR = "images_annotated"
LABEL_DIR = "labels"
EXPORT_DIR = "exports"
EXPORT_FORMATS = ("coco", "cvat", "labelstudio", "labelstudio-brush")
"""``maskops.data.formats.predictions.EXPORT_FORMATS``, listed without importing numpy."""


def _threshold(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {text}")
    return value


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "inference",
        help="detect objects in a directory of images; write annotated images and COCO JSON",
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
    parser.add_argument(
        "--annotations",
        type=Path,
        default=DEFAULTS.annotations,
        help="COCO JSON giving the ids of the images it lists (default: val_json_file)",
    )
    parser.add_argument(
        "-t",
        "--threshold",
        type=_threshold,
        default=DEFAULTS.threshold,
        help=f"minimum score (default {DEFAULTS.threshold})",
    )
    parser.add_argument("--include_mask", action="store_true", help="draw instance masks")
    _add_export_arguments(parser)
    parser.add_argument(
        "--gpu_index", type=int, default=DEFAULTS.gpu_index, help="CUDA device (CPU if none)"
    )
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def _add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """The predictions written for review in a labelling tool."""
    parser.add_argument(
        "--export",
        action="append",
        choices=EXPORT_FORMATS,
        default=[],
        help="also write the predictions for review in a labelling tool (repeatable): coco "
        "(polygons and RLE), cvat (CVAT 1.1 XML), labelstudio (pre-annotations: polygons), "
        "labelstudio-brush (pre-annotations: brush masks); into "
        f"RESULTS_DIR/{EXPORT_DIR} (with -l only: beside the label directory)",
    )
    parser.add_argument(
        "--polygon_tolerance",
        type=float,
        default=1.0,
        help="pixels the exported polygons may depart from the mask outlines (default 1)",
    )
    parser.add_argument(
        "--model_version", default="maskops", help="Label Studio's model_version (default maskops)"
    )


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
    return InferenceOptions(
        threshold=args.threshold,
        include_mask=args.include_mask,
        gpu_index=args.gpu_index,
        annotations=args.annotations,
    )


def run(args: argparse.Namespace) -> int:
    from maskops.evaluation.inference import read_class_map, run_inference

    args.model = model_argument(args.model)
    spec = load_resolved_spec(args.experiment_spec)
    out_images, labels = output_dirs(args)
    try:
        run_inference(
            spec,
            args.model,
            args.image_dir,
            out_images,
            inference_options(args),
            label_dir=labels,
            class_names=read_class_map(args.class_map) if args.class_map else None,
        )
        if args.export:
            _export(args, labels)
    except engine_errors() as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    return EXIT_OK


def _export(args: argparse.Namespace, labels: Path | None) -> None:
    from maskops.data.formats.predictions import export_predictions

    if labels is None:
        raise CLIError("--export needs -l/--out_label_dir or -r/--results_dir")
    out = (args.results_dir or labels.parent) / EXPORT_DIR
    written = export_predictions(
        labels,
        out,
        sorted(set(args.export)),
        tolerance=args.polygon_tolerance,
        model_version=args.model_version,
    )
    for path in written:
        print(f"wrote {path}")
