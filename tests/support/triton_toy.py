"""The smallest Triton python-backend model, for tests about what Triton loads."""

from __future__ import annotations

from pathlib import Path

TOY_CONFIG = """backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [1] }]
output [{ name: "OUTPUT", data_type: TYPE_FP32, dims: [1] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
# The input goes back out by DLPack: the stub's as_numpy() and Tensor(name, array) misread
# numpy 2 arrays (docs/architecture.md, "numpy 2 in the python backend").
TOY_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor.from_dlpack("OUTPUT", pb_utils.get_input_tensor_by_name(r, "IN"))]
            )
            for r in requests
        ]
"""


def toy_model(repository: Path, name: str) -> None:
    """The smallest python-backend model: loading it starts one backend stub process."""
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(TOY_CONFIG)
    (repository / name / "1" / "model.py").write_text(TOY_MODEL)
