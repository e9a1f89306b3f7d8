"""``maskops automl -e SPEC -d RESULTS_DIR [--algorithm A] [--sampler S] [--trials N]
[--parallel P] [--metric M] [--param FIELD=MIN:MAX[:log] | FIELD=A,B,C ...]``.

A hyperparameter search in this process, without the service: each trial trains the spec
with its sampled fields into ``RESULTS_DIR/trial_<n>``; the pruner stops poor trials at
their num_steps_per_eval evaluations. Running the same command again continues the search
(the study is ``RESULTS_DIR/automl.db``). The best trial's spec is written as TAO text to
``RESULTS_DIR/best_spec.txt``, every trial to ``automl_result.json``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from maskops.automl.options import AutomlOptions
from maskops.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CLIError,
    add_spec_argument,
    load_resolved_spec,
)
from maskops.cli.options import add_option_flags, options_from_args
from maskops.tasks import AUTOML

BEST_SPEC_FILE = "best_spec.txt"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "automl",
        help=AUTOML.summary,
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    add_spec_argument(parser)
    parser.add_argument("-d", "--results_dir", required=True, type=Path)
    add_option_flags(parser, AutomlOptions)
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="FIELD[=RANGE]",
        help="a searched spec field: FIELD=MIN:MAX, FIELD=MIN:MAX:log, FIELD=A,B,C or FIELD "
        "(default range); repeat it. None: learning rate, warm-up, weight decay, anchor "
        "scale, RPN/RoI batch sizes",
    )
    parser.set_defaults(handler=run)


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def _choice(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    try:
        return _number(text)
    except ValueError:
        return text


def parse_params(items: list[str]) -> dict[str, dict[str, Any]] | None:
    """``--param`` values as a search space mapping (None when there are none)."""
    if not items:
        return None
    space: dict[str, dict[str, Any]] = {}
    for item in items:
        path, _, given = item.partition("=")
        try:
            if not given:
                space[path] = {}
            elif ":" in given:
                low, high, *scale = given.split(":")
                space[path] = {"min": _number(low), "max": _number(high), "log": scale == ["log"]}
            else:
                space[path] = {"choices": [_choice(c) for c in given.split(",")]}
        except ValueError:
            raise CLIError(f"--param {item!r}: expected FIELD=MIN:MAX[:log] or FIELD=A,B") from None
    return space


def run(args: argparse.Namespace) -> int:
    from maskops.automl.search import run_search
    from maskops.automl.space import SpaceError, resolve_space
    from maskops.automl.study import SearchSettings
    from maskops.spec.text import spec_to_text

    options = options_from_args(args, AutomlOptions)
    if options.max_recommendations < 1 or options.max_concurrent < 1:
        raise CLIError("--trials and --parallel must be >= 1")
    base = load_resolved_spec(args.experiment_spec)
    try:
        space = resolve_space(parse_params(args.param), base)
    except SpaceError as exc:
        raise CLIError(f"--param {exc}") from None
    settings = SearchSettings(
        algorithm=options.algorithm,
        sampler=options.sampler or "",
        pruner=options.pruner or "",
        metric=options.metric,
        min_resource=max(1, base.num_steps_per_eval),
        max_resource=max(1, base.resolved_total_steps),
        reduction_factor=options.reduction_factor,
        seed=options.seed,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    result = run_search(
        base,
        args.results_dir,
        space,
        settings,
        trials=options.max_recommendations,
        parallel=options.max_concurrent,
    )
    for trial in result.trials:
        print(f"trial {trial.number}: {trial.state} {options.metric}={trial.value} {trial.params}")
    if result.best is None:
        print("no trial completed", file=sys.stderr)
        return EXIT_FAILURE
    from maskops.automl.search import trial_spec

    best_spec = trial_spec(base, result.best.params, options.metric)
    (args.results_dir / BEST_SPEC_FILE).write_text(spec_to_text(best_spec))
    print(f"best: trial {result.best.number} {options.metric}={result.best.value}")
    print(f"best spec: {args.results_dir / BEST_SPEC_FILE}")
    print(f"checkpoint: {result.best.checkpoint}")
    return EXIT_OK
