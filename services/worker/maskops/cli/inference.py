"""``maskops inference -i IMAGE_DIR -o OUT_IMAGE_DIR -e SPEC -m MODEL [-l OUT_LABEL_DIR]
[-t THRESHOLD] [--include_mask]``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import (
    EXIT_OK,
    CLIError,
    add_key_argument,
    engine_errors,
    load_resolved_spec,
)


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
            "boxes, class names and scores, plus instance masks with --include_mask. With -l, "
            "also write per-image COCO results JSON (<stem>.json) and coco_images.json."
        ),
    )
    parser.add_argument("-i", "--image_dir", required=True, type=Path, help="input images")
    parser.add_argument("-o", "--out_image_dir", required=True, type=Path, help="annotated images")
    parser.add_argument("-e", "--experiment_spec", required=True, type=Path, help="spec file")
    parser.add_argument(
        "-m", "--model", required=True, type=Path, help="maskops checkpoint (or exported model)"
    )
    parser.add_argument("-l", "--out_label_dir", type=Path, default=None, help="COCO JSON dir")
    parser.add_argument(
        "-t", "--threshold", type=_threshold, default=0.6, help="minimum score (default 0.6)"
    )
    parser.add_argument("--include_mask", action="store_true", help="draw instance masks")
    parser.add_argument("--gpu_index", type=int, default=0, help="CUDA device (CPU if none)")
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from maskops.evaluation.inference import run_inference

    spec = load_resolved_spec(args.experiment_spec)
    try:
        run_inference(
            spec,
            args.model,
            args.image_dir,
            args.out_image_dir,
            label_dir=args.out_label_dir,
            threshold=args.threshold,
            include_mask=args.include_mask,
            gpu_index=args.gpu_index,
        )
    except engine_errors() as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    return EXIT_OK
