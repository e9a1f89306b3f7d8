"""TensorRT engines from the exported ONNX, where TensorRT and a GPU exist.

TensorRT cannot be installed from PyPI on every machine (its libraries come from NVIDIA's
host), so :func:`tensorrt_available` is checked first and nothing pretends an engine was
built. Without it, the engine is built on a GPU host: by ``maskops gen_trt_engine`` there
(for Triton's tensorrt backend), or by Triton itself when a publish for GPUs loads the
ONNX on its onnxruntime backend with the TensorRT accelerator.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch

from maskops.atomic import atomic_write
from maskops.export.batching import image_graph
from maskops.export.graph import IMAGE_INPUT_NAMES, INPUT_NAME, TAO_INPUT_NAME
from maskops.progress import PhaseProgress, shown
from maskops.shape_rules import batch_order_error

ENGINE_ELSEWHERE = (
    "TensorRT engine not built here ({reason}); build it on the GPU host with maskops "
    "gen_trt_engine, or publish the ONNX with device gpu: Triton's TensorRT accelerator "
    "builds it as the model loads"
)

LOOP_HINT = (
    "; the dynamic batch runs the network's NonZero and NonMaxSuppression inside a TensorRT "
    "loop, which TensorRT's documentation does not cover: export with --static_batch_size N "
    "for a graph without the loop"
)


def tensorrt_unavailable_reason() -> str | None:
    """None when an engine can be built here, else why not."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "the tensorrt Python package is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


def tensorrt_available() -> bool:
    return tensorrt_unavailable_reason() is None


class EngineBuildError(RuntimeError):
    """TensorRT rejected the network or the build failed."""


@dataclass(frozen=True)
class BatchProfile:
    """The batch sizes of a TensorRT optimisation profile (TAO's ``--min/opt/max_batch_size``):
    the engine runs any batch from ``min`` to ``max`` and is tuned for ``opt``."""

    min: int
    opt: int
    max: int

    def shapes(self, image_size: tuple[int, int]) -> tuple[tuple[int, ...], ...]:
        """The image input's (min, opt, max) shapes."""
        return tuple((batch, 3, *image_size) for batch in (self.min, self.opt, self.max))


def batch_profile(
    graph_batch: int | None,
    *,
    max_batch_size: int,
    min_batch_size: int | None = None,
    opt_batch_size: int | None = None,
) -> BatchProfile:
    """The profile of a graph whose batch is ``graph_batch`` (None: dynamic).

    A dynamic graph gets ``min_batch_size`` (default 1) .. ``max_batch_size``, tuned for
    ``opt_batch_size`` (default ``max_batch_size``: under load, Triton's dynamic batcher
    fills batches). A static graph's profile is its one batch size; a flag asking for
    another is an error, not silently dropped.

    Raises:
        EngineBuildError: sizes below 1, not min <= opt <= max, or contradicting a
            static graph.
    """
    if graph_batch is not None:
        given = {
            "--min_batch_size": min_batch_size,
            "--opt_batch_size": opt_batch_size,
            "--max_batch_size": max_batch_size,
        }
        wrong = [
            f"{flag} {value}" for flag, value in given.items() if value not in (None, graph_batch)
        ]
        if wrong:
            raise EngineBuildError(
                f"{', '.join(wrong)}: the ONNX has a static batch of {graph_batch}; export "
                "without --static_batch_size for a dynamic batch"
            )
        return BatchProfile(graph_batch, graph_batch, graph_batch)
    low = 1 if min_batch_size is None else min_batch_size
    opt = max_batch_size if opt_batch_size is None else opt_batch_size
    if low < 1:
        raise EngineBuildError(f"--min_batch_size must be at least 1, got {low}")
    flags = ("--min_batch_size", "--opt_batch_size", "--max_batch_size")
    error = batch_order_error(low, opt, max_batch_size, names=flags)
    if error is not None:
        raise EngineBuildError(error)
    return BatchProfile(low, opt, max_batch_size)


@dataclass(frozen=True)
class EngineInputs:
    """What an engine build needs to know of a maskops ONNX."""

    image_size: tuple[int, int]
    batch: int | None
    """The graph's fixed batch, None when dynamic."""
    is_qdq: bool
    """Whether it holds QuantizeLinear nodes (the int8 export's explicit quantisation)."""


def onnx_engine_inputs(onnx_path: Path) -> EngineInputs:
    """The image size, batch and quantisation of a maskops ONNX's image input ``[N, 3, H,
    W]`` (``images``, or ``Input`` in the TAO layout).

    Raises:
        EngineBuildError: not an ONNX file, or no such input ``[N, 3, H, W]`` with static H
            and W.
    """
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:
        raise EngineBuildError(f"{onnx_path}: not a readable ONNX model ({exc})") from None
    for graph_input in model.graph.input:
        if graph_input.name not in IMAGE_INPUT_NAMES:
            continue
        dims = [
            d.dim_value if d.HasField("dim_value") else None
            for d in graph_input.type.tensor_type.shape.dim
        ]
        if len(dims) == 4 and dims[1] == 3 and dims[2] and dims[3]:
            # The int8 graph's QDQ nodes sit in the one-image graph, the batch Loop's body.
            is_qdq = any(n.op_type == "QuantizeLinear" for n in image_graph(model).node)
            return EngineInputs(image_size=(dims[2], dims[3]), batch=dims[0], is_qdq=is_qdq)
        break
    raise EngineBuildError(
        f"{onnx_path}: no input '{INPUT_NAME}' or '{TAO_INPUT_NAME}' [N, 3, H, W]; is it a "
        "maskops export?"
    )


def select_gpu(gpu_index: int) -> None:
    """Make CUDA device ``gpu_index`` current (cudaSetDevice, through torch) for this process:
    TensorRT builds on the current device.

    Raises:
        EngineBuildError: no CUDA device of that index.
    """
    count = torch.cuda.device_count()
    if not 0 <= gpu_index < count:
        have = f"indices 0..{count - 1}" if count else "none"
        raise EngineBuildError(f"--gpu_index {gpu_index}: no such CUDA device ({have})")
    torch.cuda.set_device(gpu_index)


def _loop_hint(onnx_path: Path) -> str:
    """:data:`LOOP_HINT` for a maskops graph of dynamic batch (a Loop over the images, see
    maskops.export.batching), else nothing; read only when a build has failed."""
    try:
        return LOOP_HINT if onnx_engine_inputs(onnx_path).batch is None else ""
    except EngineBuildError:
        return ""


def progress_monitor(trt: Any, phases: PhaseProgress) -> Any:
    """A ``trt.IProgressMonitor`` (TensorRT 10 and later) that reports to ``phases``.

    TensorRT calls it from C++ where an exception cannot pass (the process would abort),
    so a progress display that fails is dropped instead of ending the build.
    """

    class Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            with suppress(Exception):
                phases.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            with suppress(Exception):
                phases.step_complete(phase_name, step)
            return True  # False would cancel the build

        def phase_finish(self, phase_name: str) -> None:
            with suppress(Exception):
                phases.phase_finish(phase_name)

    return Monitor()


def build_engine(
    onnx_path: Path,
    engine_path: Path,
    *,
    data_type: str,
    image_size: tuple[int, int],
    profile: BatchProfile,
    workspace_bytes: int = 4 << 30,
    strict_types: bool = False,
    verbose: bool = False,
    gpu_index: int = 0,
    progress: bool = False,
) -> Path:
    """Parse ``onnx_path`` and serialise a TensorRT engine to ``engine_path``.

    fp16 sets the FP16 builder flag; int8 expects the QDQ graph (explicit quantisation:
    the scales are in the graph, no calibrator). ``profile`` gives the batch sizes of the
    optimisation profile (:func:`batch_profile`).
    ``strict_types`` (TAO's ``--strict_type_constraints``) makes TensorRT obey the layer
    precisions instead of picking faster ones; ``verbose`` logs at TensorRT's VERBOSE level.
    ``gpu_index`` is the CUDA device that builds (and so will run) the engine. ``progress``
    shows a bar per phase of the build that TensorRT reports (``engine: ...``; TensorRT 10
    and later), plain lines off a terminal. TensorRT's
    plugins are registered before parsing: the parser imports ONNX RoiAlign as the
    ROIAlign_TRT plugin from the registry.

    Raises:
        EngineBuildError: no such GPU, TensorRT rejected the network, or the build failed.
    """
    import tensorrt as trt

    select_gpu(gpu_index)
    logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
    trt.init_libnvinfer_plugins(logger, "")
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(
            f"{onnx_path}: TensorRT could not parse the ONNX: {errors}{_loop_hint(onnx_path)}"
        )
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if data_type in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if data_type == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
    if strict_types:
        # TensorRT 10 replaced STRICT_TYPES with OBEY_PRECISION_CONSTRAINTS.
        config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
    shapes = builder.create_optimization_profile()
    # The one input: images, or Input in the TAO layout.
    shapes.set_shape(network.get_input(0).name, *profile.shapes(image_size))
    config.add_optimization_profile(shapes)
    phases = PhaseProgress(desc="engine", enabled=shown(progress))
    if progress and hasattr(trt, "IProgressMonitor"):
        # The config holds no reference: the monitor lives in this frame through the build.
        monitor = progress_monitor(trt, phases)
        config.progress_monitor = monitor
    try:
        serialized = builder.build_serialized_network(network, config)
    finally:
        phases.close()
    if serialized is None:
        raise EngineBuildError(
            f"{onnx_path}: TensorRT engine build failed (see the log above){_loop_hint(onnx_path)}"
        )
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(engine_path, bytes(serialized))
