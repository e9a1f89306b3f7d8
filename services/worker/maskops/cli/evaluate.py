"""``maskops evaluate -e SPEC -m MODEL [--gpu_index I] [--log_file F] [-o JSON]``."""

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
    tee_log,
)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "evaluate",
        help="COCO box and mask metrics of a model on the spec's validation data",
        description=(
            "Run MODEL over data_config.validation_file_pattern (eval_samples images, "
            "eval_batch_size at a time) and compare with data_config.val_json_file: prints the "
            "COCO metrics under TAO's names (AP ... ARl, mask_AP ... mask_ARl) and writes them "
            "as JSON."
        ),
    )
    parser.add_argument("-e", "--experiment_spec", required=True, type=Path, help="spec file")
    parser.add_argument(
        "-m", "--model", required=True, type=Path, help="maskops checkpoint (or exported model)"
    )
    parser.add_argument("--gpu_index", type=int, default=0, help="CUDA device (CPU if none)")
    parser.add_argument("--log_file", type=Path, default=None, help="also append the log here")
    parser.add_argument(
        "-o",
        "--output_json",
        type=Path,
        default=None,
        help="metrics JSON (default: MODEL's path with suffix .eval.json)",
    )
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from maskops.evaluation.runner import run_evaluation

    spec = load_resolved_spec(args.experiment_spec)
    out_json = args.output_json or args.model.with_suffix(".eval.json")
    with tee_log(args.log_file) as log:
        try:
            run_evaluation(
                spec,
                args.model,
                out_json=out_json,
                gpu_index=args.gpu_index,
                progress=True,
                log=log,
            )
        except engine_errors() as exc:
            raise CLIError(str(exc)) from None
        except OSError as exc:
            raise CLIError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    return EXIT_OK
