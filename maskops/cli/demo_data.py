"""``maskops demo-data -o DIR [--images N] [--size H W] [--seed S]``: synthetic shapes data."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import EXIT_OK, CLIError, add_key_argument


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo-data",
        help="write a synthetic COCO instance-segmentation dataset (shapes, exact masks)",
        description=(
            "Write DIR/images/{train,val}/*.jpg and DIR/annotations/{train,val}.json: "
            "circles (category id 1), squares (3) and triangles (7) on textured backgrounds, "
            "with polygon masks that decode exactly to the drawn shapes."
        ),
    )
    parser.add_argument("-o", "--output_dir", required=True, type=Path, help="output directory")
    parser.add_argument("--images", type=int, default=200, help="images over both splits")
    parser.add_argument(
        "--size", type=int, nargs=2, default=(256, 256), metavar=("H", "W"), help="image size"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument(
        "--val_fraction", type=float, default=0.2, help="share of images in the val split"
    )
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from maskops.data.demo import generate_demo_dataset

    try:
        dataset = generate_demo_dataset(
            args.output_dir,
            num_images=args.images,
            image_size=(args.size[0], args.size[1]),
            seed=args.seed,
            val_fraction=args.val_fraction,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    except OSError as exc:
        raise CLIError(f"cannot write {args.output_dir}: {exc}") from exc
    print(f"wrote {dataset.num_train} train images to {dataset.train_images}")
    print(f"wrote {dataset.num_val} val images to {dataset.val_images}")
    print(f"annotations: {dataset.train_json}, {dataset.val_json}")
    return EXIT_OK
