"""Pieces every subcommand shares: exit codes, the error type, the TAO ``-k`` flag, spec
loading, ``--log_file`` and the engine errors that mean bad input."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maskops.spec.models import ExperimentSpec

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
"""Bad input: a malformed spec, a missing file, an unusable dataset."""


class CLIError(Exception):
    """A user-facing error: printed as one line, exit code ``EXIT_USAGE`` unless given."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


TRACEBACK = "traceback"
"""Where ``--verbose`` puts its flag in the parsed arguments (see :func:`wants_traceback`)."""
VERBOSE_HELP = "on an error, print the traceback too (errors are otherwise one line)"


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` after the command (and its actions) too; where the command has its own
    (TAO's ``prune -v``, ``gen_trt_engine -v``), that one also shows tracebacks."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                add_verbose_argument(child)
    if "--verbose" not in parser._option_string_actions:
        parser.add_argument(
            "--verbose",
            dest=TRACEBACK,
            action="store_true",
            default=argparse.SUPPRESS,
            help=VERBOSE_HELP,
        )


def wants_traceback(args: argparse.Namespace) -> bool:
    """``--verbose`` before or after the command."""
    return bool(getattr(args, TRACEBACK, False) or getattr(args, "verbose", False))


def add_key_argument(parser: argparse.ArgumentParser) -> None:
    """TAO's ``-k/--key`` (model encryption key): accepted and ignored with a notice."""
    parser.add_argument("-k", "--key", default=None, help=argparse.SUPPRESS)


def notice(flag: str, why: str) -> None:
    """One line on stderr for a TAO flag that is accepted but changes nothing here."""
    print(f"maskops: note: {flag} {why}", file=sys.stderr)


def warn_if_key_given(args: argparse.Namespace) -> None:
    if getattr(args, "key", None):
        notice("-k/--key", "is ignored (maskops artifacts are not encrypted)")


MODEL_HELP = (
    "model file, or a training results directory: RESULTS_DIR/best, RESULTS_DIR/latest "
    "(RESULTS_DIR alone: best if kept, else latest)"
)


def add_spec_argument(parser: argparse.ArgumentParser) -> None:
    """``-e/--experiment_spec``, also under TAO's long name ``--experiment_spec_file``."""
    parser.add_argument(
        "-e",
        "--experiment_spec",
        "--experiment_spec_file",
        required=True,
        type=Path,
        help="spec file",
    )


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """``-m/--model``, also under TAO's long name ``--model_path`` (see MODEL_HELP)."""
    parser.add_argument("-m", "--model", "--model_path", required=True, type=Path, help=MODEL_HELP)


def model_argument(path: Path) -> Path:
    """The model file ``-m`` names (see maskops.checkpoints.run_directory.resolve_model_path)."""
    from maskops.checkpoints.run_directory import resolve_model_path

    try:
        return resolve_model_path(path)
    except FileNotFoundError as exc:
        raise CLIError(f"-m {exc}") from None


def load_resolved_spec(path: Path) -> ExperimentSpec:
    """The spec at ``path`` with its relative paths resolved against its directory."""
    from maskops.spec import SpecError, load_spec

    try:
        return load_spec(path).resolve_paths(path.parent)
    except SpecError as exc:
        raise CLIError(str(exc)) from None


@contextmanager
def tee_log(log_file: Path | None) -> Iterator[Callable[[str], None]]:
    """A ``log(line)`` that prints and, with ``--log_file``, appends to that file too."""
    if log_file is None:
        yield print
        return
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handle = log_file.open("a", encoding="utf-8")
    except OSError as exc:
        raise CLIError(f"--log_file {log_file}: {exc.strerror}") from None
    with handle:

        def log(line: str) -> None:
            print(line)
            handle.write(line + "\n")
            handle.flush()

        yield log


def engine_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input (a one-line error), not a bug (a traceback)."""
    from maskops.device import DeviceError
    from maskops.evaluation.errors import EvaluationError
    from maskops.spec import SpecError

    errors: list[type[BaseException]] = [DeviceError, EvaluationError, SpecError]
    for module, name in (
        ("maskops.data.coco", "DatasetError"),
        ("maskops.checkpoints.model_file", "CheckpointError"),
    ):
        try:
            errors.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            continue
    return tuple(errors)
