"""``_<name>.net`` on the ``torch`` network backend: the checkpoint run by PyTorch.

Publish copies this file as the network's ``model.py``, next to ``model.pth`` (the train
or prune job's checkpoint) and ``settings.json`` (``precision``; optional
``channels_last``, and ``outputs_via_host``, see below). Unlike
the other served models it imports torch and the maskops engine
(:class:`maskops.serving.torch_network.TorchNetwork`, the same forward in-process
inference runs): only the Triton images that install the engine serve it (the ``torch``
variant of services/triton/Dockerfile; ``maskops serve``, whose Python has it).

Inputs: ``images`` UINT8 ``[3, H, W]`` per batch item (FP32 in versions published before);
outputs as the ONNX network's
(:mod:`maskops.serving.protocol`). The images of all the requests Triton's dynamic batcher
hands over together run as one batch and the rows go back to their requests. Tensors
cross the stub by DLPack both ways (numpy 2 safe, and a GPU output is handed over
without a copy to host memory here). With ``outputs_via_host`` a GPU instance copies the
batch's outputs to host memory in one go instead (:func:`to_host`), where the CPU
postprocess model reads them: bench/gpu_serving.py measures both ways on a GPU.

Device: a ``KIND_GPU`` instance runs on its GPU (``cuda:<device id>``), a ``KIND_CPU``
one on the CPU; the network is built once, in ``initialize``, and Triton's log says where
it runs and at which precision.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import triton_python_backend_utils as pb_utils

from maskops.serving.protocol import NET_INPUT, NET_OUTPUTS
from maskops.serving.torch_network import TorchNetwork, to_host


def instance_device(args: dict[str, Any]) -> str:
    """``cuda:<id>`` for a GPU instance, ``cpu`` otherwise."""
    if args.get("model_instance_kind") == "GPU":
        return f"cuda:{int(args.get('model_instance_device_id', 0))}"
    return "cpu"


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        settings = json.loads((version_dir / "settings.json").read_text())
        device = instance_device(args)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(
                f"{args.get('model_name')}: a GPU instance, but this torch sees no CUDA "
                f"device (torch {torch.__version__}, CUDA {torch.version.cuda})"
            )
        self.network = TorchNetwork(
            version_dir / "model.pth",
            device=device,
            precision=str(settings.get("precision", "auto")),
            channels_last=bool(settings.get("channels_last", False)),
        )
        self.where = f"{args.get('model_name')} instance {args.get('model_instance_name')}"
        via_host = bool(settings.get("outputs_via_host", False))
        self.gpu_outputs = device.startswith("cuda") and not via_host
        pb_utils.Logger.log_info(
            f"{self.where}: torch {torch.__version__} on {device}, "
            f"precision {self.network.precision}"
            + (", outputs via host memory" if via_host else "")
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        per_request = [
            torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, NET_INPUT))
            for request in requests
        ]
        sizes = [int(item.shape[0]) for item in per_request]
        outputs = self.network(torch.cat(per_request))
        if not self.gpu_outputs:
            outputs = tuple(to_host(outputs))
        responses = []
        for rows in zip(*(out.split(sizes) for out in outputs), strict=True):
            tensors = [
                self._hand_over(name, row.contiguous())
                for name, row in zip(NET_OUTPUTS, rows, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _hand_over(self, name: str, tensor: torch.Tensor) -> Any:
        """``tensor`` as an output by DLPack; a GPU tensor stays on the GPU unless this
        Triton's stub cannot take one (then every later batch's outputs go through host
        memory, which the log says once)."""
        if tensor.is_cuda and not self.gpu_outputs:
            tensor = tensor.cpu()
        try:
            return pb_utils.Tensor.from_dlpack(name, tensor)
        except Exception as exc:
            if not tensor.is_cuda:
                raise
            self.gpu_outputs = False
            pb_utils.Logger.log_warn(
                f"{self.where}: outputs go through host memory: the stub refused a GPU "
                f"tensor ({exc})"
            )
            return pb_utils.Tensor.from_dlpack(name, tensor.cpu())
