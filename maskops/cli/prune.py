"""``maskops prune -m MODEL -o OUT [-n max|L2] [-eq ...] [-pg 8] [-pth 0.1] [-nf 16] [-el L ...]
[-v]``.

``-o`` is normally a directory (``OUT/model.pth`` and ``OUT/prune_report.json``). TAO's own
command lines pass a model *file* there (``-o /results/model_pruned.tlt``); a path ending in
.pth/.pt/.tlt/.hdf5 is honoured as such: the pruned model (still a maskops checkpoint,
whatever the extension) is written at exactly that path and the report next to it.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maskops.cli.common import EXIT_OK, MODEL_HELP, CLIError, add_key_argument, model_argument
from maskops.cli.options import add_option_flags, options_from_args
from maskops.prune.options import PruneOptions
from maskops.tasks import PRUNE

if TYPE_CHECKING:
    from maskops.prune.report import PruneReport

MODEL_FILE_SUFFIXES = (".pth", ".pt", ".tlt", ".hdf5")


def output_location(output: Path) -> tuple[Path, str | None]:
    """(directory, model file name or None for the default) for ``-o``."""
    if output.suffix.lower() in MODEL_FILE_SUFFIXES:
        return output.parent, output.name
    return output, None


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "prune",
        help=PRUNE.summary,
        description=(
            "Structured pruning: filters whose normalised L2 norm is under the threshold are "
            "removed from the ResNet backbone, the FPN and the RPN head conv, in multiples "
            "of the granularity and "
            "keeping at least min_filters per layer; the heads' inputs follow the FPN. Retrain "
            "the result with the spec's pruned_model_path. "
            "Writes OUT/model.pth and OUT/prune_report.json."
        ),
    )
    parser.add_argument("-m", "--model", required=True, type=Path, help=MODEL_HELP)
    parser.add_argument(
        "-o",
        "--output_dir",
        "--output_file",
        dest="output",
        required=True,
        type=Path,
        help="output directory, or a model file path ending in .pth/.pt/.tlt/.hdf5",
    )
    add_option_flags(parser, PruneOptions)
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also list every coupled group of convs: pruned, kept, excluded or fixed",
    )
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def report_text(args: argparse.Namespace, report: PruneReport) -> str:
    """What the command prints about ``report``: the table, with ``-v`` the groups too
    (TAO's -v prints its model summaries before and after)."""
    text = report.format_table()
    return f"{text}\n\n{report.format_groups()}" if args.verbose else text


def prune_options(args: argparse.Namespace) -> PruneOptions:
    """The :class:`PruneOptions` the flags ask for."""
    options = options_from_args(args, PruneOptions)
    # TAO users also write -el a,b.
    layers = tuple(n for arg in options.excluded_layers for n in arg.split(",") if n)
    return replace(options, excluded_layers=layers)


def run(args: argparse.Namespace) -> int:
    from maskops.prune import PruneError
    from maskops.prune.run import run_prune

    args.model = model_argument(args.model)
    out_dir, model_filename = output_location(args.output)
    if out_dir.exists() and not out_dir.is_dir():
        raise CLIError(f"-o {args.output}: {out_dir} exists and is not a directory")
    where: dict[str, Any] = {} if model_filename is None else {"model_filename": model_filename}
    try:
        report = run_prune(args.model, out_dir, prune_options(args), **where)
    except PruneError as exc:
        raise CLIError(str(exc)) from None
    print(report_text(args, report))
    print(f"pruned model: {report.output_model}")
    print(f"report: {out_dir / 'prune_report.json'}")
    return EXIT_OK
