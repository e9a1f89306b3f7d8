"""TensorRT engines from the exported ONNX, where TensorRT and a GPU exist.

TensorRT cannot be installed from PyPI on every machine (its libraries come from NVIDIA's
host), so :func:`tensorrt_available` is checked first and nothing pretends an engine was
built: without it, the engine is built on the GPU host by the Triton container at start
(``services/triton/entrypoint.sh``: trtexec with the same precision and shapes).
"""

from __future__ import annotations

from pathlib import Path

import torch

from maskops.export.graph import INPUT_NAME

ENGINE_ELSEWHERE = (
    "TensorRT engine not built here ({reason}); the Triton service builds it on the GPU host "
    "at start from the ONNX with the same precision (services/triton/entrypoint.sh)"
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


def onnx_engine_inputs(onnx_path: Path) -> tuple[tuple[int, int], bool]:
    """``((H, W), is_qdq)`` of a maskops ONNX: its ``images`` input ``[1, 3, H, W]`` and
    whether it holds QuantizeLinear nodes (the int8 export's explicit quantisation).

    Raises:
        EngineBuildError: not an ONNX file, or no static ``images [1, 3, H, W]`` input.
    """
    import onnx

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:
        raise EngineBuildError(f"{onnx_path}: not a readable ONNX model ({exc})") from None
    for graph_input in model.graph.input:
        if graph_input.name != INPUT_NAME:
            continue
        dims = [
            d.dim_value if d.HasField("dim_value") else 0
            for d in graph_input.type.tensor_type.shape.dim
        ]
        if len(dims) == 4 and dims[1] == 3 and dims[2] > 0 and dims[3] > 0:
            is_qdq = any(node.op_type == "QuantizeLinear" for node in model.graph.node)
            return (dims[2], dims[3]), is_qdq
        break
    raise EngineBuildError(
        f"{onnx_path}: no static input '{INPUT_NAME}' [1, 3, H, W]; is it a maskops export?"
    )


def build_engine(
    onnx_path: Path,
    engine_path: Path,
    *,
    data_type: str,
    image_size: tuple[int, int],
    workspace_bytes: int = 4 << 30,
    strict_types: bool = False,
    verbose: bool = False,
) -> Path:
    """Parse ``onnx_path`` and serialise a TensorRT engine to ``engine_path``.

    fp16 sets the FP16 builder flag; int8 expects the QDQ graph (explicit quantisation:
    the scales are in the graph, no calibrator). The graph's batch dimension is 1 (see
    :mod:`maskops.export.graph`), so the optimisation profile is that one shape.
    ``strict_types`` (TAO's ``--strict_type_constraints``) makes TensorRT obey the layer
    precisions instead of picking faster ones; ``verbose`` logs at TensorRT's VERBOSE level.
    """
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"{onnx_path}: TensorRT could not parse the ONNX: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if data_type in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if data_type == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
    if strict_types:
        # TensorRT 10 replaced STRICT_TYPES with OBEY_PRECISION_CONSTRAINTS.
        config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
    profile = builder.create_optimization_profile()
    shape = (1, 3, *image_size)
    profile.set_shape(INPUT_NAME, shape, shape, shape)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineBuildError(f"{onnx_path}: TensorRT engine build failed (see the log above)")
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    engine_path.write_bytes(bytes(serialized))
    return engine_path
