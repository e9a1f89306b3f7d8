"""``maskops dataset_convert``: COCO JSON (or another labelling tool's format) + images ->
validated shards (TAO flags)."""

from __future__ import annotations

import argparse
from contextlib import closing
from pathlib import Path
from typing import Any

from maskops.cli.common import EXIT_OK, CLIError, add_key_argument, tee_log
from maskops.cli.options import add_option_flags, options_from_args
from maskops.data.convert_options import DEFAULT_FORMAT, ConvertOptions
from maskops.progress import Progress, progress_bar
from maskops.tasks import DATASET_CONVERT

RESULTS_LOG = "dataset_convert.log"
"""What ``-r RESULTS_DIR`` holds: the conversion summary (TAO writes its status log there)."""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "dataset_convert",
        help=DATASET_CONVERT.summary,
        description=(
            "Validate a COCO dataset and write OUT_DIR/<tag>-NNNNN-of-MMMMM.tar shards, "
            "<tag>_manifest.json (label map, counts, checksums) and <tag>_warnings.json "
            "(every finding, keyed by image id). Exits 2 only when the JSON is malformed "
            "or nothing usable remains."
        ),
    )
    parser.add_argument("-i", "--image_dir", required=True, type=Path, help="image directory")
    parser.add_argument(
        "-a",
        "--annotations_file",
        required=True,
        type=Path,
        help="COCO instances JSON, or the annotations in --format (a file or a folder)",
    )
    parser.add_argument("-o", "--output_dir", required=True, type=Path, help="output directory")
    add_option_flags(parser, ConvertOptions, types={"labels": comma_separated})
    parser.add_argument(
        "-r",
        "--results_dir",
        type=Path,
        default=None,
        help=f"also append the summary to RESULTS_DIR/{RESULTS_LOG}",
    )
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def log_file(args: argparse.Namespace) -> Path | None:
    """Where ``-r`` sends the summary, or None (TAO's default, /tmp, is not kept: without
    -r the summary is only printed)."""
    return args.results_dir / RESULTS_LOG if args.results_dir is not None else None


def comma_separated(text: str) -> tuple[str, ...] | None:
    """``--labels a,b``'s names (none: the converter's default)."""
    return tuple(n.strip() for n in text.split(",")) if text else None


def convert_options(args: argparse.Namespace) -> ConvertOptions:
    """The :class:`ConvertOptions` the flags ask for."""
    return options_from_args(args, ConvertOptions)


class ConversionProgress:
    """The conversion's ``progress(done, total)`` callback as a bar (plain lines off a
    terminal), made at the first call, when the total is known."""

    def __init__(self) -> None:
        self._bar: Progress | None = None
        self._done = 0

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = progress_bar(total, desc="convert", unit="img")
        self._bar.update(done - self._done)
        self._done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run(args: argparse.Namespace) -> int:
    from maskops.data.formats import coco_path, convert_labelled_dataset

    progress = ConversionProgress()
    try:
        with closing(progress):
            result = convert_labelled_dataset(
                args.image_dir,
                args.annotations_file,
                args.output_dir,
                convert_options(args),
                progress=progress,
            )
    except ValueError as exc:  # a DatasetError, or a --labels list with repeated names
        raise CLIError(str(exc)) from exc
    except OSError as exc:
        raise CLIError(f"{exc.filename or args.output_dir}: {exc.strerror or exc}") from exc
    with tee_log(log_file(args)) as log:
        if args.format_name != DEFAULT_FORMAT:
            log(f"read {args.format_name} annotations into {coco_path(result.out_dir, result.tag)}")
        log(result.summary())
    return EXIT_OK
