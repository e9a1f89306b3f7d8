"""``maskops spec``: check a spec file, or print the defaults as a spec.

``maskops spec check SPEC`` parses and validates a TAO text spec (or ``.json``) and prints the
normalised spec (every field, defaults filled in) as JSON, or as TAO text with ``--text``;
a bad spec prints its one-line error (``spec.txt:23: field: message``) and exits 2.
``maskops spec defaults`` prints the default spec as TAO text.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from maskops.cli.common import EXIT_OK, CLIError, add_key_argument
from maskops.spec import ExperimentSpec, SpecError, load_spec, spec_to_text


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "spec", help="check experiment spec files", description=__doc__.split("\n\n")[1]
    )
    actions = parser.add_subparsers(dest="spec_action", metavar="ACTION", required=True)

    check = actions.add_parser("check", help="validate a spec and print it normalised")
    check.add_argument("spec", metavar="SPEC", help="TAO text spec, or a .json spec")
    check.add_argument("--text", action="store_true", help="print TAO text instead of JSON")
    check.add_argument(
        "--resolve-paths",
        action="store_true",
        help="make relative paths absolute against the spec file's directory, as train does",
    )
    add_key_argument(check)
    check.set_defaults(handler=_check)

    defaults = actions.add_parser(
        "defaults", aliases=["show-defaults"], help="print the default spec as TAO text"
    )
    defaults.set_defaults(handler=_defaults)


def _check(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        raise CLIError(str(exc)) from None
    if args.resolve_paths:
        spec = spec.resolve_paths(Path(args.spec).parent)
    if args.text:
        sys.stdout.write(spec_to_text(spec))
    else:
        print(json.dumps(spec.model_dump(mode="json"), indent=2))
    if spec.num_epochs > 0:
        print(
            f"note: num_epochs {spec.num_epochs} gives total_steps {spec.resolved_total_steps} "
            f"(num_epochs * num_examples_per_epoch / train_batch_size, rounded up)",
            file=sys.stderr,
        )
    return EXIT_OK


def _defaults(args: argparse.Namespace) -> int:
    sys.stdout.write(spec_to_text(ExperimentSpec()))
    return EXIT_OK
