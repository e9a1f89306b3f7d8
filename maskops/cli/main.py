"""Entry point: ``maskops COMMAND ...``.

Each subcommand lives in its own module under ``maskops.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``handler`` (a function taking the
parsed arguments and returning an exit code). Handlers raise :class:`CLIError` for bad
input; it is printed as one line and the process exits non-zero. Any other exception is
one line too (its type and message), with the traceback only under ``--verbose``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version

from maskops.cli.common import (
    EXIT_FAILURE,
    TRACEBACK,
    VERBOSE_HELP,
    CLIError,
    add_verbose_argument,
    wants_traceback,
    warn_if_key_given,
)

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
    "weights",
    "completion",
)

PLUGIN_GROUP = "maskops.commands"
"""Entry points adding subcommands from other installed packages (the control plane's
``serve`` and ``token``): each names a module with the same ``register(subparsers)``."""


def maskops_version() -> str:
    """The installed distribution's version (``unknown`` when run from an uninstalled tree)."""
    try:
        return version("maskops")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maskops",
        description="Mask R-CNN instance segmentation: TAO-compatible commands on PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"maskops {maskops_version()}")
    parser.add_argument("--verbose", dest=TRACEBACK, action="store_true", help=VERBOSE_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"maskops.cli.{name}").register(subparsers)
    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        entry.load().register(subparsers)
    for command in subparsers.choices.values():
        add_verbose_argument(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warn_if_key_given(args)
    try:
        code: int = args.handler(args)
    except CLIError as exc:
        return _failed(args, exc, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        print(f"maskops {args.command}: interrupted", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:
        # Anything else is unexpected, but a user still gets one line, and --verbose
        # gives the traceback to report.
        return _failed(args, exc, f"{type(exc).__name__}: {exc}", EXIT_FAILURE)
    return code


def _failed(args: argparse.Namespace, exc: BaseException, message: str, code: int) -> int:
    """Print ``maskops COMMAND: error: MESSAGE`` on one line (the traceback first under
    ``--verbose``); return the exit code."""
    if wants_traceback(args):
        traceback.print_exception(exc, file=sys.stderr)
    else:
        message = " ".join(message.split())
        if code == EXIT_FAILURE and not isinstance(exc, CLIError):
            message += " (--verbose shows the traceback)"
    print(f"maskops {args.command}: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
