"""``maskops weights list|pull``: the published weights a spec's ``checkpoint`` may name.

``maskops weights list`` prints the torchvision weights that fit this model (Mask R-CNN
COCO, ImageNet ResNets), their file and whether the weights cache holds it. ``maskops
weights pull NAME|URL#sha256=HEX ...`` fetches them into the cache (hash checked) and prints
each file's path; with ``MASKOPS_OFFLINE=1`` it only says which are missing and where to
place them. The cache: ``--cache_dir``, else ``$MASKOPS_WEIGHTS_DIR``, else
``$MASKOPS_DATA_ROOT/cache/weights``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import EXIT_OK, CLIError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "weights",
        help="list and fetch pretrained weights (torchvision names, URLs)",
        description=__doc__.split("\n\n")[1],
    )
    actions = parser.add_subparsers(dest="weights_action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="torchvision weights that fit, and the cache")
    pull = actions.add_parser("pull", help="fetch weights into the cache")
    pull.add_argument(
        "references",
        nargs="+",
        metavar="NAME|URL",
        help="e.g. MaskRCNN_ResNet50_FPN_Weights.COCO_V1, or https://host/f.pth#sha256=HEX",
    )
    for command in (listing, pull):
        command.add_argument(
            "--cache_dir", type=Path, default=None, help="the weights cache (see above)"
        )
    listing.set_defaults(handler=run_list)
    pull.set_defaults(handler=run_pull)


def weights_rows(cache_dir: Path | None) -> list[tuple[str, str, str]]:
    """``(name, file, state)`` of every listed weights: ``cached``, or the size to fetch."""
    from torchvision.models import get_weight

    from maskops.checkpoints.hub import LISTED_WEIGHTS, cached_weights, weights_source

    rows = []
    for enum_name in LISTED_WEIGHTS:
        for member in type(get_weight(f"{enum_name}.DEFAULT")):
            source = weights_source(f"{enum_name}.{member.name}")
            size = f"{source.size_mb:.0f} MB" if source.size_mb else "size unknown"
            state = "cached" if cached_weights(source, cache_dir) else f"not cached ({size})"
            rows.append((source.reference, source.file_name, state))
    return rows


def run_list(args: argparse.Namespace) -> int:
    from maskops.checkpoints.hub import weights_cache_dir

    rows = weights_rows(args.cache_dir)
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    for name, file_name, state in rows:
        print(f"{name:<{widths[0]}}  {file_name:<{widths[1]}}  {state}")
    print(f"cache: {args.cache_dir or weights_cache_dir()}")
    return EXIT_OK


def run_pull(args: argparse.Namespace) -> int:
    from maskops.checkpoints.hub import fetch_weights
    from maskops.checkpoints.model_file import CheckpointError

    for reference in args.references:
        try:
            path = fetch_weights(reference, args.cache_dir)
        except CheckpointError as exc:
            raise CLIError(str(exc)) from None
        print(f"{reference}: {path}")
    return EXIT_OK
