"""Entry point: ``maskops COMMAND ...``.

Each subcommand lives in its own module under ``maskops.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``handler`` (a function taking the
parsed arguments and returning an exit code). Handlers raise :class:`CLIError` for bad
input; it is printed as one line and the process exits non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from maskops.cli.common import EXIT_FAILURE, CLIError, warn_if_key_given

COMMAND_MODULES: tuple[str, ...] = (
    "spec",
    "demo_data",
    "dataset_convert",
    "train",
    "automl",
    "evaluate",
    "inference",
    "prune",
    "export",
    "gen_trt_engine",
    "publish",
)

PLUGIN_GROUP = "maskops.commands"
"""Entry points adding subcommands from other installed packages (the control plane's
``serve`` and ``token``): each names a module with the same ``register(subparsers)``."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maskops",
        description="Mask R-CNN instance segmentation: TAO-compatible commands on PyTorch.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"maskops.cli.{name}").register(subparsers)
    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        entry.load().register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warn_if_key_given(args)
    try:
        code: int = args.handler(args)
    except CLIError as exc:
        print(f"maskops {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"maskops {args.command}: interrupted", file=sys.stderr)
        return EXIT_FAILURE
    return code


if __name__ == "__main__":
    sys.exit(main())
