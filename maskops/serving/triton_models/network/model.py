"""``_<name>.net``: the exported ONNX graph on onnxruntime (hosts without TensorRT backend).

Inputs: ``images`` FP32 ``[3, H, W]`` per batch item. Outputs per item, padded to D
detections: ``boxes`` FP32 ``[D, 4]``, ``scores`` FP32 ``[D]``, ``labels`` INT64 ``[D]``,
``masks`` FP32 ``[D, M, M]``, ``num_detections`` INT32 ``[1]``. The graph takes a batch
(see maskops.export.graph): the images of all the requests Triton's dynamic batcher hands
over together run as one batch and the rows go back to their requests. A graph of static
batch S (``--static_batch_size``; S = 1 for files exported before batching) runs S images
at a time, the last run filled with zero images. ``MASKOPS_ORT_THREADS`` (or ``threads``
in settings.json) sets onnxruntime's intra-op threads.

Device: an instance of kind GPU (``instance_group`` KIND_GPU, what publish writes for GPU
hosts) runs on onnxruntime's CUDA provider on the instance's GPU when this onnxruntime has
it (the ``triton-gpu`` extra installs onnxruntime-gpu), the CPU provider taking what CUDA
cannot; otherwise, and for KIND_CPU instances, on the CPU provider. Triton's log says
which providers the session got.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

# maskops_serving_ops.py is copied next to this file by publish (Triton runs each model in
# its own stub process, so the plain module name cannot collide).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import maskops_serving_ops as ops

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def session_providers(args: dict[str, Any], available: list[str]) -> list[Any]:
    """onnxruntime's providers for this instance: CUDA on the instance's GPU, then the CPU,
    for a GPU instance where onnxruntime has CUDA; else the CPU alone."""
    if args.get("model_instance_kind") == "GPU" and CUDA in available:
        device = int(args.get("model_instance_device_id", 0))
        return [(CUDA, {"device_id": device}), CPU]
    return [CPU]


def _load_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of the nvidia-* wheels (onnxruntime-gpu's
    ``cuda,cudnn`` extras): they sit in site-packages, off the dynamic loader's path."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()


def _log_providers(args: dict[str, Any], asked: list[Any], got: list[str]) -> None:
    """One line in Triton's log; a warning when a GPU instance runs on the CPU."""
    where = f"{args.get('model_name')} instance {args.get('model_instance_name')}"
    if args.get("model_instance_kind") == "GPU" and CUDA not in got:
        why = "has no CUDA provider" if asked == [CPU] else "could not start its CUDA provider"
        pb_utils.Logger.log_warn(
            f"{where}: GPU instance runs on the CPU: this onnxruntime {why} "
            "(GPU images install onnxruntime-gpu: the triton-gpu extra)"
        )
    else:
        pb_utils.Logger.log_info(f"{where}: onnxruntime providers {got}")


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        settings = json.loads((version_dir / "settings.json").read_text())
        threads = int(os.environ.get("MASKOPS_ORT_THREADS", "0")) or settings.get("threads")
        # The engine's session options (maskops.export.predictor.session_options).
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = int(threads)
        providers = session_providers(args, ort.get_available_providers())
        if providers[0] != CPU:
            _load_cuda_libraries()
        self.session = ort.InferenceSession(
            str(version_dir / "model.onnx"), sess_options=options, providers=providers
        )
        _log_providers(args, providers, self.session.get_providers())
        self.output_names = list(ops.NET_OUTPUTS)
        first = self.session.get_inputs()[0].shape[0]
        self.static_batch = first if isinstance(first, int) else None

    def execute(self, requests: list[Any]) -> list[Any]:
        per_request = [ops.input_array(pb_utils, request, ops.NET_INPUT) for request in requests]
        images = np.concatenate(per_request).astype(np.float32, copy=False)
        outputs = ops.run_batched(self._run, images, self.static_batch)
        responses = []
        start = 0
        for item in per_request:
            rows = slice(start, start + len(item))
            start += len(item)
            tensors = [
                ops.output_tensor(pb_utils, name, out[rows])
                for name, out in zip(self.output_names, outputs, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        outputs: list[np.ndarray] = self.session.run(self.output_names, {ops.NET_INPUT: images})
        return outputs
