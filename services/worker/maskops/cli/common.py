"""Pieces every subcommand shares: the error type, the TAO ``-k`` flag, exit codes."""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
"""Bad input: a malformed spec, a missing file, an unusable dataset."""


class CLIError(Exception):
    """A user-facing error: printed as one line, exit code ``EXIT_USAGE`` unless given."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def add_key_argument(parser: argparse.ArgumentParser) -> None:
    """TAO's ``-k/--key`` (model encryption key): accepted and ignored with a notice."""
    parser.add_argument("-k", "--key", default=None, help=argparse.SUPPRESS)


def warn_if_key_given(args: argparse.Namespace) -> None:
    if getattr(args, "key", None):
        print(
            "maskops: note: -k/--key is ignored (maskops artifacts are not encrypted)",
            file=sys.stderr,
        )
