"""``maskops gen_trt_engine -m MODEL.onnx -r RESULTS_DIR [--engine_file E] ...``: tao-deploy's
``mask_rcnn gen_trt_engine`` with its flags, on the ONNX ``maskops export`` writes.

The engine is built where the ``tensorrt`` package and a CUDA GPU exist; elsewhere the
command fails with one line saying why (exit 1) after checking the ONNX, TensorRT's import
rules included (:mod:`maskops.export.tensorrt_rules`). int8 engines use the symmetric QDQ
graph of ``maskops export --data_type int8 --target tensorrt`` (explicit quantisation: the
scales were calibrated at export), so tao-deploy's calibration flags are accepted with a
notice.

Next to the engine it writes ``ENGINE.json``, the record of the TensorRT version, GPU, ONNX
and profile that built it (:mod:`maskops.serving.engines`): ``maskops publish --net_backend
tensorrt`` serves an engine only with it, and only in a Triton of the same TensorRT.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maskops.cli.common import EXIT_FAILURE, EXIT_OK, CLIError, add_key_argument, notice
from maskops.cli.options import add_option_flags
from maskops.export.engine_options import (
    DEFAULT_CALIBRATION_BATCH_SIZE,
    DEFAULT_CALIBRATION_BATCHES,
    GenTrtEngineOptions,
)
from maskops.tasks import GEN_TRT_ENGINE

if TYPE_CHECKING:
    from maskops.export.tensorrt import BatchProfile

GB = 1 << 30

_CALIBRATION_WHY = (
    "is ignored: a maskops int8 engine takes its scales from the QDQ ONNX; calibrate with "
    "`maskops export --data_type int8 --cal_image_dir ...`"
)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "gen_trt_engine",
        help=GEN_TRT_ENGINE.summary,
        description=(
            "Build a TensorRT engine from the ONNX `maskops export` wrote (fp32, fp16, or "
            "int8 from the int8 QDQ export of --target tensorrt), and its record ENGINE.json "
            "(TensorRT version, GPU, ONNX, profile) that `maskops publish --net_backend "
            "tensorrt` checks. The ONNX is first checked against TensorRT's ONNX import rules "
            "(exit 2 naming node and rule). Needs the tensorrt package and a CUDA GPU; "
            "elsewhere it exits 1 with the reason."
        ),
    )
    parser.add_argument("-m", "--model_path", required=True, type=Path, help="the .onnx file")
    parser.add_argument(
        "-r", "--results_dir", required=True, type=Path, help="output directory (created)"
    )
    parser.add_argument(
        "-e",
        "--experiment_spec_file",
        "--experiment_spec",
        dest="experiment_spec",
        type=Path,
        default=None,
        help="spec file (optional): its data_config.image_size must match the ONNX input",
    )
    add_option_flags(parser, GenTrtEngineOptions)
    add_key_argument(parser)
    parser.set_defaults(handler=run)


def ignored_flag_notices(args: argparse.Namespace) -> list[str]:
    """Print a notice for each tao-deploy flag given that changes nothing; return them."""
    given: list[str] = []
    for flag in ("cal_image_dir", "cal_data_file", "cal_cache_file"):
        if getattr(args, flag):
            notice(f"--{flag}", _CALIBRATION_WHY)
            given.append(flag)
    if (
        args.batches != DEFAULT_CALIBRATION_BATCHES
        or args.batch_size != DEFAULT_CALIBRATION_BATCH_SIZE
    ):
        notice("--batches/--batch_size", _CALIBRATION_WHY)
        given.append("batches")
    return given


def engine_path(args: argparse.Namespace) -> Path:
    """``--engine_file``, or ``RESULTS_DIR/<onnx stem>.<data_type>.engine``."""
    if args.engine_file is not None:
        return Path(args.engine_file)
    stem = args.model_path.stem
    suffix = f".{args.data_type}"
    return args.results_dir / f"{stem.removesuffix(suffix)}{suffix}.engine"


def _check_inputs(args: argparse.Namespace) -> tuple[tuple[int, int], BatchProfile]:
    """The ONNX's image size and the engine's batch profile, after the checks that need no
    GPU."""
    from maskops.cli.common import load_resolved_spec
    from maskops.export.graph import read_metadata
    from maskops.export.tensorrt import EngineBuildError, batch_profile, onnx_engine_inputs

    model: Path = args.model_path
    if not model.is_file():
        raise CLIError(f"-m {model}: no such file")
    if model.suffix in (".etlt", ".tlt"):
        raise CLIError(
            f"-m {model}: TAO's encrypted {model.suffix} models are not read; export the "
            "maskops model with `maskops export` and pass its .onnx"
        )
    try:
        inputs = onnx_engine_inputs(model)
        max_batch_size = args.max_batch_size
        if max_batch_size is None:  # a static graph's own batch, else the export's maximum
            max_batch_size = inputs.batch or read_metadata(model).max_batch_size
        profile = batch_profile(
            inputs.batch,
            max_batch_size=max_batch_size,
            min_batch_size=args.min_batch_size,
            opt_batch_size=args.opt_batch_size,
        )
    except (EngineBuildError, ValueError, KeyError) as exc:
        raise CLIError(str(exc)) from None
    image_size = inputs.image_size
    if args.data_type == "int8" and not inputs.is_qdq:
        raise CLIError(
            f"-m {model}: --data_type int8 needs the QDQ ONNX of "
            "`maskops export --data_type int8` (this graph has no QuantizeLinear nodes)"
        )
    if args.experiment_spec is not None:
        spec_size = tuple(load_resolved_spec(args.experiment_spec).data_config.image_size)
        if spec_size != image_size:
            raise CLIError(
                f"-e {args.experiment_spec}: data_config.image_size {list(spec_size)} differs "
                f"from the ONNX input {list(image_size)}"
            )
    if args.max_workspace_size <= 0:
        raise CLIError("--max_workspace_size must be positive (GB)")
    if args.gpu_index < 0:
        raise CLIError(f"--gpu_index must be at least 0, got {args.gpu_index}")
    _check_tensorrt_rules(model)
    return image_size, profile


def _check_tensorrt_rules(model: Path) -> None:
    """Fail with the broken TensorRT import rules of the ONNX, before any GPU work."""
    import onnx

    from maskops.export.tensorrt_rules import check_tensorrt_graph, describe

    violations = check_tensorrt_graph(onnx.load(str(model)))
    if violations:
        raise CLIError(
            f"-m {model}: TensorRT cannot import it: {describe(violations)}; export it with "
            "`maskops export --target tensorrt`"
        )


def run(args: argparse.Namespace) -> int:
    from maskops.export.tensorrt import EngineBuildError, build_engine, tensorrt_unavailable_reason

    ignored_flag_notices(args)
    image_size, profile = _check_inputs(args)
    reason = tensorrt_unavailable_reason()
    if reason is not None:
        raise CLIError(f"no TensorRT engine built: {reason}", exit_code=EXIT_FAILURE)
    try:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        target = build_engine(
            args.model_path,
            engine_path(args),
            data_type=args.data_type,
            image_size=image_size,
            profile=profile,
            workspace_bytes=int(args.max_workspace_size * GB),
            strict_types=args.strict_type_constraints,
            verbose=args.verbose,
            gpu_index=args.gpu_index,
            progress=True,
        )
    except EngineBuildError as exc:
        raise CLIError(str(exc), exit_code=EXIT_FAILURE) from None
    except OSError as exc:
        raise CLIError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    record = record_engine(target, args.model_path, args.data_type, image_size, profile)
    print(f"TensorRT engine built: {target} (record: {record})")
    return EXIT_OK


def record_engine(
    engine: Path,
    onnx_path: Path,
    data_type: str,
    image_size: tuple[int, int],
    profile: BatchProfile,
) -> Path:
    """Write the record next to an engine built in this process; return its path."""
    from maskops.serving.engines import builder_facts, write_engine_record

    version, gpu = builder_facts()
    return write_engine_record(
        engine,
        onnx_path=onnx_path,
        data_type=data_type,
        image_size=image_size,
        profile=(profile.min, profile.opt, profile.max),
        tensorrt_version=version,
        gpu=gpu,
    )
