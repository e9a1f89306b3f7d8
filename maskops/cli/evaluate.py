"""``maskops evaluate -e SPEC -m MODEL [-r RESULTS_DIR] [-i IMAGE_DIR] [--gpu_index I]
[--log_file F] [-o JSON]``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maskops.cli.common import (
    EXIT_OK,
    CLIError,
    add_key_argument,
    add_model_argument,
    add_spec_argument,
    engine_errors,
    load_resolved_spec,
    model_argument,
    notice,
    tee_log,
)
from maskops.cli.options import add_option_flags, options_from_args
from maskops.evaluation.options import EvaluateOptions
from maskops.tasks import EVALUATE

if TYPE_CHECKING:
    from maskops.spec.models import ExperimentSpec

RESULTS_JSON = "evaluation.json"
RESULTS_LOG = "evaluate.log"
"""What ``-r RESULTS_DIR`` holds (TAO writes its evaluation status there)."""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "evaluate",
        help=EVALUATE.summary,
        description=(
            "Run MODEL over data_config.validation_file_pattern (eval_samples images, "
            "eval_batch_size at a time) and compare with data_config.val_json_file: prints the "
            "COCO metrics under TAO's names (AP ... ARl, mask_AP ... mask_ARl) and writes them "
            "as JSON."
        ),
    )
    add_spec_argument(parser)
    add_model_argument(parser)
    parser.add_argument("--log_file", type=Path, default=None, help="also append the log here")
    parser.add_argument(
        "-o",
        "--output_json",
        type=Path,
        default=None,
        help=f"metrics JSON (default: RESULTS_DIR/{RESULTS_JSON}, else MODEL's path with "
        "suffix .eval.json)",
    )
    parser.add_argument(
        "-r",
        "--results_dir",
        type=Path,
        default=None,
        help=f"write {RESULTS_JSON} and {RESULTS_LOG} here (unless -o / --log_file say where)",
    )
    add_option_flags(parser, EvaluateOptions)
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def outputs(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """(metrics JSON, log file or None) for the parsed flags."""
    results = args.results_dir
    out_json = args.output_json or (
        results / RESULTS_JSON if results is not None else args.model.with_suffix(".eval.json")
    )
    log_file = args.log_file or (results / RESULTS_LOG if results is not None else None)
    return out_json, log_file


def image_dir(args: argparse.Namespace, spec: ExperimentSpec) -> Path | None:
    """``-i`` when the spec has no validation shards; with shards, a notice and None."""
    if args.image_dir is not None and spec.data_config.validation_file_pattern:
        notice(
            "-i/--image_dir",
            "is ignored: the validation shards (data_config.validation_file_pattern) hold "
            "the images",
        )
        return None
    return Path(args.image_dir) if args.image_dir is not None else None


def evaluate_options(args: argparse.Namespace, spec: ExperimentSpec) -> EvaluateOptions:
    """The :class:`EvaluateOptions` the flags ask for (a notice for an ``-i`` the spec's
    shards make useless)."""
    return replace(options_from_args(args, EvaluateOptions), image_dir=image_dir(args, spec))


def run(args: argparse.Namespace) -> int:
    from maskops.evaluation.runner import run_evaluation

    args.model = model_argument(args.model)
    spec = load_resolved_spec(args.experiment_spec)
    out_json, log_file = outputs(args)
    with tee_log(log_file) as log:
        try:
            run_evaluation(
                spec,
                args.model,
                evaluate_options(args, spec),
                out_json=out_json,
                progress=True,
                log=log,
            )
        except engine_errors() as exc:
            raise CLIError(str(exc)) from None
        except OSError as exc:
            raise CLIError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    return EXIT_OK
