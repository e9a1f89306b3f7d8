"""Count the calls that make the host wait for a GPU, on any device, a CPU included.

On a GPU the host queues kernels ahead of the device until a call needs a result on the
host: a value (``.item()``, ``bool(t)``, ``.tolist()``), or a shape that depends on the
data (``torch.where(mask)``, ``x[mask]``, ``torch.unique``, NMS). Each such call waits
for all the work queued before it, and the device then idles while the host queues more.
``torch.cuda.set_sync_debug_mode`` counts them on a GPU only; :class:`HostReadCounter`
recognises the same calls by the operators they dispatch to, so a CPU run (CI) can hold
their number per training step.

The other way, a tensor made from host data inside a step (``torch.tensor(0.5,
device=x.device)``, ``torch.as_tensor(weights, device=x.device)``) is a copy to a GPU that
the host waits for; :attr:`HostReadCounter.from_host` counts those. On a CPU the tensor's
device does not say whether the code would copy on a GPU, so every tensor made from host
data counts there, whatever its device.

It counts what the code asks for, not what a device does: a GPU may wait at a call it
does not list (a copy to pageable host memory), and NMS runs on the CPU without a wait.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_SHAPE_FROM_DATA = {
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten._unique.default,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
    _aten.bincount.default,  # its length is the input's maximum
    _aten.repeat_interleave.Tensor,
    _aten.masked_scatter.default,
}
_VALUE_TO_HOST = {_aten._local_scalar_dense.default, _aten.equal.default}
_INDEXING = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default}
_HOST_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__}
# ``torch.tensor``/``as_tensor``/``from_numpy``/``Tensor.new_tensor`` of Python or NumPy data
# make the tensor on the CPU outside any mode and then dispatch ``lift_fresh`` (on a GPU,
# after the copy to it). ``scalar_tensor`` (a Python scalar as an operand, as in
# ``torch.where(mask, x, -1.0)``) is not one: it stays a CPU scalar a kernel takes as an
# argument, or is filled on the device.
_MADE_FROM_HOST = {_aten.lift_fresh.default, _aten.lift_fresh_copy.default, _aten.lift.default}


def _is_boolean_index(args: Sequence[Any]) -> bool:
    """An ``index``/``index_put`` call with a mask among its indices (its count is read)."""
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
        for index in indices
    )


def _reads_the_host(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    if func in _VALUE_TO_HOST:
        return True
    if func in _SHAPE_FROM_DATA:
        return not (func is _aten.repeat_interleave.Tensor and kwargs.get("output_size"))
    if func in _INDEXING:
        return _is_boolean_index(args)
    if func is _aten._to_copy.default:  # a device tensor copied to the host
        device = kwargs.get("device")
        source = args[0]
        return source.device.type != "cpu" and device is not None and device.type == "cpu"
    return str(func).startswith("torchvision.nms.")  # the number of boxes kept


def _copies_from_host(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """A tensor made from host data, or a blocking copy of a host tensor to a device."""
    if func in _MADE_FROM_HOST:
        return True
    if func is _aten._to_copy.default:
        device = kwargs.get("device")
        blocking = not kwargs.get("non_blocking", False)
        return (
            args[0].device.type == "cpu"
            and device is not None
            and device.type != "cpu"
            and blocking
        )
    if func is _aten.copy_.default:
        destination, source = args[0], args[1]
        blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        return source.device.type == "cpu" and destination.device.type != "cpu" and blocking
    return False


class _OperatorReads(TorchDispatchMode):
    def __init__(self, record: Callable[[str], None]) -> None:
        super().__init__()
        self.record = record
        self.quiet = False  # inside a method already counted (a GPU tensor's tolist copies)
        self.dispatched = 0
        self.from_host: Counter[str] = Counter()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self.dispatched += 1
        if not self.quiet and _reads_the_host(func, args, kwargs):
            self.record(str(func))
        if _copies_from_host(func, args, kwargs):
            self.from_host[str(func)] += 1
        return func(*args, **kwargs)


class _MethodReads(TorchFunctionMode):
    """``tolist``/``numpy`` of a CPU tensor dispatch no operator: seen at the Python level."""

    def __init__(self, record: Callable[[str], None], operators: _OperatorReads) -> None:
        super().__init__()
        self.record = record
        self.operators = operators

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        if func not in _HOST_METHODS:
            return func(*args, **(kwargs or {}))
        self.record(f"Tensor.{func.__name__}")
        self.operators.quiet = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.operators.quiet = False


class HostReadCounter:
    """Within ``with HostReadCounter() as reads:``, ``reads.total`` counts the calls that
    would make the host wait for a GPU, and ``reads.by_call`` names them;
    ``reads.from_host`` counts the tensors made from host data (each a copy to a GPU that
    the host waits for) and ``reads.from_host_by_call`` names them; ``reads.operators``
    counts every operator dispatched (views included), the host's share of the work: each
    is a Python call and a dispatch, and most a kernel launch on a GPU."""

    def __init__(self) -> None:
        self.by_call: Counter[str] = Counter()
        self._operators = _OperatorReads(self._record)
        self._modes = (_MethodReads(self._record, self._operators), self._operators)

    @property
    def total(self) -> int:
        return sum(self.by_call.values())

    @property
    def from_host(self) -> int:
        return sum(self._operators.from_host.values())

    @property
    def from_host_by_call(self) -> Counter[str]:
        return self._operators.from_host

    @property
    def operators(self) -> int:
        return self._operators.dispatched

    def _record(self, name: str) -> None:
        self.by_call[name] += 1

    def __enter__(self) -> HostReadCounter:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(kind, error, traceback)
