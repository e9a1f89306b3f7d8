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

ANNOTATED_DIR = "images_annotated"
LABEL_DIR = "labels"


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
        default=None,
        help="COCO JSON giving the ids of the images it lists (default: val_json_file)",
    )
    parser.add_argument(
        "-t", "--threshold", type=_threshold, default=0.6, help="minimum score (default 0.6)"
    )
    parser.add_argument("--include_mask", action="store_true", help="draw instance masks")
    parser.add_argument("--gpu_index", type=int, default=0, help="CUDA device (CPU if none)")
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
            label_dir=labels,
            threshold=args.threshold,
            include_mask=args.include_mask,
            gpu_index=args.gpu_index,
            annotations=args.annotations,
            class_names=read_class_map(args.class_map) if args.class_map else None,
        )
    except engine_errors() as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    return EXIT_OK
