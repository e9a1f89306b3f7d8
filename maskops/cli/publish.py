"""``maskops publish -m EXPORT -n NAME [--repository DIR] [--triton_url URL ...]``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import EXIT_OK, CLIError, add_key_argument
from maskops.cli.options import add_option_flags, options_from_args
from maskops.serving.publish_options import IMAGE_LIMITS, PublishOptions
from maskops.tasks import PUBLISH

IMAGE_LIMITS_DESCRIPTION = (
    "the preprocess model refuses larger images from their header, before decoding them, "
    "as MASKOPS_MAX_INFER_IMAGE_* do for /infer (default: Pillow's own limit)"
)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "publish",
        help=PUBLISH.summary,
        description=(
            "Write NAME (an ensemble: NAME_preprocess -> NAME_net -> NAME_postprocess) into "
            "the model repository as a new version. Clients send encoded images and get COCO "
            "results. With --triton_url (once per replica) every running Triton loads the new "
            "version and retires the old one without interrupting requests; if one cannot, "
            "the version is undone and the one before serves again everywhere."
        ),
    )
    parser.add_argument(
        "-m",
        "--model",
        required=True,
        type=Path,
        help="exported .onnx; with --net_backend torch, a train or prune checkpoint",
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    add_option_flags(
        parser, PublishOptions, group_descriptions={IMAGE_LIMITS: IMAGE_LIMITS_DESCRIPTION}
    )
    parser.add_argument(
        "--triton_url",
        action="append",
        default=[],
        help=(
            "host:port of a Triton replica that loads the new version (repeat for several); "
            "a server with model control behind a key wants it in MASKOPS_TRITON_CONTROL_KEY"
        ),
    )
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from maskops.serving import PublishError
    from maskops.serving.placement import Placement, parse_gpus
    from maskops.serving.protocol import ImageLimits
    from maskops.serving.rollout import RolloutFailed, publish_and_roll_out

    options = options_from_args(args, PublishOptions)
    try:
        placement = Placement(options.device, parse_gpus(options.gpus))
    except ValueError as exc:
        raise CLIError(f"--device/--gpus: {exc}") from None
    try:
        version, rollout = publish_and_roll_out(
            args.model,
            args.repository,
            options.name,
            args.triton_url,
            net_backend=options.net_backend,
            placement=placement,
            engine=options.engine,
            engine_cache_root=options.triton_engine_cache,
            triton_tensorrt_version=options.triton_tensorrt_version,
            max_batch_size=options.max_batch_size,
            instances=options.instances,
            processing_instances=options.processing_instances,
            max_queue_delay_us=options.max_queue_delay_us,
            precision=options.precision,
            image_limits=ImageLimits(
                max_image_pixels=options.max_image_pixels,
                max_image_side=options.max_image_side,
                max_image_aspect=options.max_image_aspect,
            ),
        )
    except (PublishError, RolloutFailed) as exc:
        raise CLIError(str(exc)) from None
    print(f"Published {options.name} version {version} in {args.repository}")
    if rollout is not None:
        print(f"Triton: {rollout.summary()}")
    return EXIT_OK
