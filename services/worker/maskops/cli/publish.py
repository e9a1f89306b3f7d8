"""``maskops publish -m EXPORT -n NAME [--repository DIR] [--triton_url URL]``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import EXIT_OK, CLIError, add_key_argument


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "publish",
        help="add an exported ONNX to a Triton model repository as a new version",
        description=(
            "Write NAME (an ensemble: NAME_preprocess -> NAME_net -> NAME_postprocess) into "
            "the model repository as a new version. Clients send encoded images and get COCO "
            "results. With --triton_url the running Triton loads the new version and retires "
            "the old one without interrupting requests."
        ),
    )
    parser.add_argument("-m", "--model", required=True, type=Path, help="exported .onnx")
    parser.add_argument("-n", "--name", required=True, help="model name clients will call")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument(
        "--net_backend",
        choices=("python", "onnxruntime", "tensorrt"),
        default="python",
        help="how Triton runs the network: onnxruntime in the python backend (PyPI Triton), "
        "or the official image's onnxruntime / TensorRT backends",
    )
    parser.add_argument("--max_batch_size", type=int, default=None)
    parser.add_argument("--triton_url", default=None, help="host:port: load the new version")
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from maskops.serving import PublishError, publish

    try:
        version = publish(
            args.model,
            args.repository,
            args.name,
            net_backend=args.net_backend,
            max_batch_size=args.max_batch_size,
        )
    except PublishError as exc:
        raise CLIError(str(exc)) from None
    print(f"Published {args.name} version {version} in {args.repository}")
    if args.triton_url:
        from maskops.serving import client

        try:
            client.roll_out(args.triton_url, args.name)
        except client.TritonError as exc:
            raise CLIError(f"--triton_url {args.triton_url}: {exc}") from None
        print(f"Triton at {args.triton_url} now serves {args.name} version {version}")
    return EXIT_OK
