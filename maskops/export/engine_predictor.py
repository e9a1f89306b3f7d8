"""Run a TensorRT engine that ``maskops export --engine_file`` or ``maskops gen_trt_engine``
built, with the eager model's call shape, so that the engine's detections can be compared
with onnxruntime's on its ONNX (:func:`maskops.export.parity.compare_detections`).

Only where TensorRT and a GPU exist (:func:`maskops.export.tensorrt.tensorrt_available`).
TensorRT 10's tensor API runs it: ``set_input_shape``, ``set_tensor_address`` and
``execute_async_v3`` on torch's CUDA memory and stream. The engine's outputs must have
shapes known once the input's is set: maskops' graphs and the TAO layout have (padded
to the export's ``max_detections``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from maskops.export.graph import GraphMetadata, read_metadata
from maskops.export.parity import ParityReport, compare_detections
from maskops.export.predictor import GraphPredictor, OnnxPredictor
from maskops.export.tensorrt import EngineBuildError, select_gpu


class EngineRunner:
    """One deserialised engine and its execution context on CUDA device ``gpu_index``.

    Raises:
        EngineBuildError: no such GPU, or TensorRT could not deserialise the engine (built
            by another TensorRT version, or for another GPU).
    """

    def __init__(self, engine_path: Path, *, gpu_index: int = 0) -> None:
        import tensorrt as trt

        select_gpu(gpu_index)
        self.device = torch.device("cuda", gpu_index)
        self._trt: Any = trt
        logger = trt.Logger(trt.Logger.WARNING)
        trt.init_libnvinfer_plugins(logger, "")  # the RoiAlign plugin the parser imported
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(engine_path.read_bytes())
        if self.engine is None:
            raise EngineBuildError(
                f"{engine_path}: TensorRT {trt.__version__} could not deserialise the engine "
                "(built by another TensorRT version or for another GPU?)"
            )
        self.context = self.engine.create_execution_context()
        # A stream of its own: on the legacy default stream TensorRT synchronises more.
        self.stream = torch.cuda.Stream(self.device)

    def _io_names(self, mode: Any) -> list[str]:
        names = (self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors))
        return [name for name in names if self.engine.get_tensor_mode(name) == mode]

    def _dtype(self, name: str) -> np.dtype[Any]:
        return np.dtype(self._trt.nptype(self.engine.get_tensor_dtype(name)))

    def run(self, names: Sequence[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The engine's outputs ``names`` for the inputs ``feed`` (name -> host array, cast
        to the input's type), as host arrays of the outputs' types."""
        trt = self._trt
        buffers: dict[str, torch.Tensor] = {}
        for name in self._io_names(trt.TensorIOMode.INPUT):
            if name not in feed:
                raise KeyError(f"the engine's input {name!r} was not given")
            host = np.ascontiguousarray(feed[name], dtype=self._dtype(name))
            buffers[name] = torch.from_numpy(host).to(self.device)
            if not self.context.set_input_shape(name, tuple(host.shape)):
                raise EngineBuildError(
                    f"input {name!r} of shape {tuple(host.shape)} is outside the engine's "
                    "optimisation profile (see its log above)"
                )
        for name in self._io_names(trt.TensorIOMode.OUTPUT):
            shape = tuple(self.context.get_tensor_shape(name))
            if any(size < 0 for size in shape):
                raise EngineBuildError(f"output {name!r} has a data-dependent shape {shape}")
            dtype = torch.from_numpy(np.empty(0, self._dtype(name))).dtype
            buffers[name] = torch.empty(shape, dtype=dtype, device=self.device)
        for name, buffer in buffers.items():
            self.context.set_tensor_address(name, buffer.data_ptr())
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the input copies
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise EngineBuildError("TensorRT could not run the engine (see its log above)")
        self.stream.synchronize()
        return [buffers[name].cpu().numpy() for name in names]


class EnginePredictor(GraphPredictor):
    """A :class:`~maskops.export.predictor.GraphPredictor` over a TensorRT engine, with the
    metadata of the ONNX it was built from (its layout, image size and batch).

    Args:
        engine_path: the serialised engine.
        onnx_path: the exported ONNX it was built from.
        gpu_index: the CUDA device that runs it (the one that built it).
    """

    def __init__(
        self,
        engine_path: Path,
        *,
        onnx_path: Path,
        gpu_index: int = 0,
        metadata: GraphMetadata | None = None,
    ) -> None:
        super().__init__(metadata or read_metadata(onnx_path))
        self.runner = EngineRunner(engine_path, gpu_index=gpu_index)

    def run_outputs(self, names: Sequence[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.runner.run(names, feed)


def engine_parity(
    engine_path: Path,
    onnx_path: Path,
    images: Sequence[torch.Tensor],
    *,
    data_type: str,
    gpu_index: int = 0,
) -> ParityReport:
    """The engine's detections on ``images`` (``[3, H, W]`` RGB 0..1, resized and padded to
    the export's size) against onnxruntime's (CPU) on the ONNX it was built from, within
    ``data_type``'s tolerances (:data:`maskops.export.parity.TOLERANCES`)."""
    reference = OnnxPredictor(onnx_path, providers=["CPUExecutionProvider"])(images)
    engine = EnginePredictor(engine_path, onnx_path=onnx_path, gpu_index=gpu_index)(images)
    return compare_detections(reference, engine, data_type=data_type)
