"""How the python-backend models hand tensors to Triton's stub under numpy 2: by DLPack,
asked for as the stub asks (``__dlpack__()`` with no arguments, so no read-only flag)."""

from __future__ import annotations

import types
from typing import Any

import numpy as np

from maskops.serving.triton_models.maskops_serving_ops import input_array, output_tensor


class _StubTensor:
    """What the stub keeps of an output: the array it reads through a DLPack capsule."""

    def __init__(self, name: str, producer: Any) -> None:
        self.name = name
        self.array = np.from_dlpack(_LegacyConsumer(producer))


class _LegacyConsumer:
    """Asks ``producer`` for a capsule the way Triton's stub does: no version, no flags."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def __dlpack__(self, **_: Any) -> Any:
        return self.producer.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        device: tuple[int, int] = self.producer.__dlpack_device__()
        return device


PB_UTILS = types.SimpleNamespace(
    Tensor=types.SimpleNamespace(from_dlpack=_StubTensor),
    get_input_tensor_by_name=lambda request, name: request[name],
)


def test_a_read_only_input_view_goes_back_out_as_a_copy() -> None:
    received = np.arange(12, dtype=np.float32).reshape(3, 4)
    received.flags.writeable = False  # as np.from_dlpack gives Triton's inputs
    view = input_array(PB_UTILS, {"x": received}, "x")[1:]  # contiguous, read-only
    out = output_tensor(PB_UTILS, "y", view)
    assert out.name == "y" and out.array.tolist() == view.tolist()
    assert not np.shares_memory(out.array, received)


def test_a_writable_contiguous_output_is_handed_over_without_a_copy() -> None:
    rows = np.full((2, 5), 32, dtype=np.uint8)
    out = output_tensor(PB_UTILS, "detections_json", rows)
    assert np.shares_memory(out.array, rows) and out.array.tolist() == rows.tolist()
