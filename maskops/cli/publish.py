"""``maskops publish -m EXPORT -n NAME [--repository DIR] [--triton_url URL ...]``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import EXIT_OK, CLIError, add_key_argument
from maskops.serving.placement import ENGINE_CACHE_ROOT, PRECISIONS


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "publish",
        help="add an exported ONNX to a Triton model repository as a new version",
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
    parser.add_argument("-n", "--name", required=True, help="model name clients will call")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    add_network_arguments(parser)
    add_serving_arguments(parser)
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def add_network_arguments(parser: argparse.ArgumentParser) -> None:
    """Where and how Triton runs the network."""
    parser.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="where Triton runs the network (the pre/post-processing always run on the CPU)",
    )
    parser.add_argument(
        "--gpus",
        default="",
        help="with --device gpu: GPU ids for the network's instances, e.g. 0,1 (default: all)",
    )
    parser.add_argument(
        "--net_backend",
        choices=("python", "onnxruntime", "tensorrt", "torch"),
        default=None,
        help="how Triton runs the network: onnxruntime in the python backend (default on "
        "the CPU; the PyPI Triton has only this), Triton's onnxruntime backend (default on "
        "GPUs, with the TensorRT accelerator: Triton builds the engine at load), a "
        "TensorRT engine from `maskops gen_trt_engine` (tensorrt, GPUs only) or the "
        "checkpoint run by PyTorch in the python backend (torch: GPU hosts without "
        "TensorRT, or the CPU)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="with --net_backend torch: fp32, or bf16/fp16 autocast on GPUs (auto: bf16 "
        "where the GPU has it natively, else fp16; fp32 on the CPU)",
    )
    parser.add_argument(
        "--engine",
        type=Path,
        default=None,
        help="with --net_backend tensorrt: the engine (default: MODEL with .engine); its "
        "record (ENGINE.json) must name the TensorRT that Triton runs",
    )
    parser.add_argument(
        "--triton_tensorrt_version",
        default=None,
        help="the TensorRT of the Triton that serves the engine (default: the version in "
        "the Triton image maskops pins)",
    )
    parser.add_argument(
        "--triton_engine_cache",
        default=ENGINE_CACHE_ROOT,
        help="where each Triton process caches the TensorRT engines of --device gpu, as "
        "Triton sees it; it must exist there (default: %(default)s, which maskops' Triton "
        "image makes)",
    )
    parser.add_argument("--max_batch_size", type=int, default=None)


def add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """The preprocess model's image limits and the replicas that load the new version."""
    limits = parser.add_argument_group(
        "image limits",
        "the preprocess model refuses larger images from their header, before decoding "
        "them, as MASKOPS_MAX_INFER_IMAGE_* do for /infer (default: Pillow's own limit)",
    )
    limits.add_argument("--max_image_pixels", type=int, default=None)
    limits.add_argument("--max_image_side", type=int, default=None, help="longest side")
    limits.add_argument(
        "--max_image_aspect", type=float, default=None, help="long side / short side"
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


def run(args: argparse.Namespace) -> int:
    from maskops.serving import PublishError
    from maskops.serving.placement import Placement, parse_gpus
    from maskops.serving.protocol import ImageLimits
    from maskops.serving.rollout import RolloutFailed, publish_and_roll_out

    try:
        placement = Placement(args.device, parse_gpus(args.gpus))
    except ValueError as exc:
        raise CLIError(f"--device/--gpus: {exc}") from None
    try:
        version, rollout = publish_and_roll_out(
            args.model,
            args.repository,
            args.name,
            args.triton_url,
            net_backend=args.net_backend,
            placement=placement,
            engine=args.engine,
            engine_cache_root=args.triton_engine_cache,
            triton_tensorrt_version=args.triton_tensorrt_version,
            max_batch_size=args.max_batch_size,
            precision=args.precision,
            image_limits=ImageLimits(
                max_image_pixels=args.max_image_pixels,
                max_image_side=args.max_image_side,
                max_image_aspect=args.max_image_aspect,
            ),
        )
    except (PublishError, RolloutFailed) as exc:
        raise CLIError(str(exc)) from None
    print(f"Published {args.name} version {version} in {args.repository}")
    if rollout is not None:
        print(f"Triton: {rollout.summary()}")
    return EXIT_OK
