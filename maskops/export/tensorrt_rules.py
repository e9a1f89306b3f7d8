"""TensorRT's ONNX import rules, checked on a graph before any GPU sees it.

The rules and their source (onnx-tensorrt's table of supported ONNX operators and its ONNX
importer, the TensorRT version, the date they were taken) are data:
``tensorrt_onnx_support.json`` next to this module. :func:`check_tensorrt_graph` walks the
graph and every subgraph (Loop and If bodies) and returns one :class:`Violation` per node
that breaks a rule. An empty list means the graph breaks none of the rules recorded there;
it does not prove that an engine builds (a rule TensorRT has and the file does not state is
not checked).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper, shape_inference

SUPPORT_FILE = Path(__file__).with_name("tensorrt_onnx_support.json")
TOPK_MAX_K = 3840
"""onnx-tensorrt's operator table: TopK's ``K`` input must be less than this."""
AXES_INPUTS: dict[str, int] = {
    "Slice": 3,
    "Squeeze": 1,
    "Unsqueeze": 1,
    "Pad": 3,
    **dict.fromkeys(("ReduceMax", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceMean"), 1),
}
"""Ops whose ``axes`` input (its position) TensorRT needs as a constant."""
RESIZE_MODES = {
    "mode": {"nearest", "linear"},
    "coordinate_transformation_mode": {
        "half_pixel",
        "pytorch_half_pixel",
        "tf_half_pixel_for_nn",
        "asymmetric",
        "align_corners",
    },
    "nearest_mode": {"floor", "ceil", "round_prefer_floor", "round_prefer_ceil"},
}
PLUGINS: dict[str, str] = {"RoiAlign": "ROIAlign_TRT"}
"""ONNX ops TensorRT's parser imports as plugins from the registry (importer, see the file)."""


@cache
def support() -> dict[str, Any]:
    """The parsed ``tensorrt_onnx_support.json``."""
    data: dict[str, Any] = json.loads(SUPPORT_FILE.read_text())
    return data


@dataclass(frozen=True)
class Violation:
    """One node breaking one rule. ``path`` names the subgraphs it sits in, outermost first
    (``"batch/over_images.body"``); empty for the top graph."""

    node: str
    op_type: str
    path: str
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}/{self.node}" if self.path else self.node
        return f"{where} ({self.op_type}): rule {self.rule}: {self.message}"


@dataclass
class _Scope:
    """What a graph's nodes can see: constants and inferred shapes/types, outer scopes too."""

    constants: dict[str, np.ndarray]
    shapes: dict[str, list[int | None] | None]
    types: dict[str, int]
    path: str

    def child(self, graph: onnx.GraphProto, path: str) -> _Scope:
        scope = _Scope(dict(self.constants), dict(self.shapes), dict(self.types), path)
        scope.add(graph)
        return scope

    def add(self, graph: onnx.GraphProto) -> None:
        for init in graph.initializer:
            self.constants[init.name] = numpy_helper.to_array(init)
            self.types[init.name] = init.data_type
            self.shapes[init.name] = list(init.dims)
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
                self.types[node.output[0]] = node.attribute[0].t.data_type
        for value in [*graph.input, *graph.value_info, *graph.output]:
            tensor = value.type.tensor_type
            if tensor.elem_type:
                self.types.setdefault(value.name, tensor.elem_type)
            if tensor.HasField("shape"):
                self.shapes[value.name] = [
                    int(d.dim_value) if d.HasField("dim_value") else None for d in tensor.shape.dim
                ]


def _subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, attr.g
        for sub in attr.graphs:
            yield attr.name, sub


def _reads(graph: onnx.GraphProto, name: str) -> bool:
    """Whether any node of ``graph`` (subgraphs included) or its outputs read ``name``."""
    if any(value.name == name for value in graph.output):
        return True
    for node in graph.node:
        if name in node.input:
            return True
        if any(_reads(sub, name) for _, sub in _subgraphs(node)):
            return True
    return False


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


Finding = tuple[str, str]
"""(rule, message) of one broken rule."""


def _op_supported(node: onnx.NodeProto, scope: _Scope) -> list[Finding]:
    if node.domain not in ("", "ai.onnx"):
        return [("op-supported", f"domain {node.domain!r} is not ONNX's: no TensorRT importer")]
    entry = support()["operators"].get(node.op_type)
    if entry is None or not entry["supported"]:
        state = "not in" if entry is None else "marked unsupported in"
        return [("op-supported", f"{node.op_type} is {state} TensorRT's ONNX operator table")]
    return []


def _loop(node: onnx.NodeProto, scope: _Scope) -> list[Finding]:
    """The condition input and static per-iteration scan outputs."""
    if node.op_type != "Loop":
        return []
    body: onnx.GraphProto = _attr(node, "body", None)
    findings: list[Finding] = []
    has_cond = len(node.input) > 1 and bool(node.input[1])
    if not has_cond and len(body.input) > 1 and _reads(body, body.input[1].name):
        findings.append(
            (
                "loop-condition",
                f"the body reads its condition {body.input[1].name!r} but the Loop has no "
                "condition input: TensorRT registers the body's condition only when given one",
            )
        )
    states = len(node.input) - 2
    inner = scope.child(body, "")
    for value in list(body.output)[1 + states :]:
        shape = inner.shapes.get(value.name)
        if shape is None or any(dim is None for dim in shape):
            findings.append(
                (
                    "loop-scan-static",
                    f"scan output {value.name!r} has no static per-iteration shape "
                    f"(inferred: {shape}); TensorRT concatenates equal rows only",
                )
            )
    return findings


def _if(node: onnx.NodeProto, scope: _Scope) -> list[Finding]:
    if node.op_type != "If":
        return []
    then: onnx.GraphProto = _attr(node, "then_branch", None)
    other: onnx.GraphProto = _attr(node, "else_branch", None)
    if len(then.output) != len(other.output):
        return [("if-branches", "the branches have different numbers of outputs")]
    findings: list[Finding] = []
    then_scope, else_scope = scope.child(then, ""), scope.child(other, "")
    for a, b in zip(then.output, other.output, strict=True):
        if a.name == b.name:
            findings.append(("if-branches", f"both branches name their output {a.name!r}"))
        ranks = (then_scope.shapes.get(a.name), else_scope.shapes.get(b.name))
        if ranks[0] is not None and ranks[1] is not None and len(ranks[0]) != len(ranks[1]):
            findings.append(
                ("if-branches", f"outputs {a.name!r}, {b.name!r} differ in rank: {ranks}")
            )
    return findings


def _type_name(elem_type: int | None) -> str:
    return TensorProto.DataType.Name(elem_type) if elem_type else "unknown"


def _zero_point(node: onnx.NodeProto, scope: _Scope) -> list[Finding]:
    """The zero point of a Q/DQ node: INT8, a constant, all zeros."""
    name = node.input[2] if len(node.input) > 2 else ""
    if not name:
        if node.op_type == "QuantizeLinear":  # ONNX: no zero point means a UINT8 result
            return [("qdq-int8-symmetric", "no zero point: the result is UINT8; give an INT8 0")]
        return []
    elem = scope.types.get(name)
    if elem != TensorProto.INT8:
        return [("qdq-int8-symmetric", f"zero point {name!r} is {_type_name(elem)}, not INT8")]
    value = scope.constants.get(name)
    if value is None:
        return [("qdq-int8-symmetric", f"zero point {name!r} is not a constant")]
    if np.any(value != 0):
        return [
            (
                "qdq-int8-symmetric",
                f"zero point {name!r} is not all zeros (asymmetric): TensorRT only "
                "supports symmetric quantization",
            )
        ]
    return []


def _qdq(node: onnx.NodeProto, scope: _Scope) -> list[Finding]:
    if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
        return []
    findings = _zero_point(node, scope)
    if node.op_type == "DequantizeLinear":
        elem = scope.types.get(node.input[0])
        if elem is not None and elem != TensorProto.INT8:
            findings.append(
                (
                    "qdq-int8-symmetric",
                    f"dequantizes {_type_name(elem)} {node.input[0]!r}: TensorRT's "
                    "DequantizeLinear takes INT8 (FP8, INT4) only",
                )
            )
    return findings


def _topk(node: onnx.NodeProto, scope: _Scope) -> list[Finding]:
    if node.op_type != "TopK":
        return []
    findings: list[Finding] = []
    if int(_attr(node, "sorted", 1)) != 1:
        findings.append(("topk", "sorted must be 1"))
    k_name = node.input[1] if len(node.input) > 1 else ""
    k = _attr(node, "k", None) if not k_name else scope.constants.get(k_name)
    if k is not None and int(np.ravel(k)[0]) >= TOPK_MAX_K:
        findings.append(("topk", f"K = {int(np.ravel(k)[0])} is not less than {TOPK_MAX_K}"))
    return findings


def _axes(node: onnx.NodeProto, scope: _Scope) -> list[Finding]:
    position = AXES_INPUTS.get(node.op_type)
    if position is None or len(node.input) <= position or not node.input[position]:
        return []
    name = node.input[position]
    if name in scope.constants:
        return []
    return [("axes-constant", f"axes {name!r} is computed at run time, not a constant")]


def _resize_and_pool(node: onnx.NodeProto, scope: _Scope) -> list[Finding]:
    findings: list[Finding] = []
    if node.op_type == "Resize":
        defaults = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel"}
        defaults["nearest_mode"] = "round_prefer_floor"
        for name, allowed in RESIZE_MODES.items():
            value = _text(_attr(node, name, defaults[name]))
            if value not in allowed:
                findings.append(
                    ("resize-modes", f"{name} {value!r} is not one of {sorted(allowed)}")
                )
        if int(_attr(node, "antialias", 0)):
            findings.append(("resize-modes", "antialiasing is not supported"))
    if node.op_type == "MaxPool":
        if len(node.output) > 1 and node.output[1]:
            findings.append(("maxpool", "the Indices output is not supported"))
        if any(d != 1 for d in _attr(node, "dilations", [])):
            findings.append(("maxpool", "dilations must be empty or all ones"))
    return findings


_RULES = (_op_supported, _loop, _if, _qdq, _topk, _axes, _resize_and_pool)


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _walk(graph: onnx.GraphProto, scope: _Scope) -> Iterator[Violation]:
    for node in graph.node:
        for check in _RULES:
            for rule, message in check(node, scope):
                yield Violation(node.name, node.op_type, scope.path, rule, message)
        for attr_name, sub in _subgraphs(node):
            path = (
                f"{scope.path}/{node.name}.{attr_name}"
                if scope.path
                else f"{node.name}.{attr_name}"
            )
            yield from _walk(sub, scope.child(sub, path))


def _clear_scan_shapes(graph: onnx.GraphProto) -> None:
    for node in graph.node:
        if node.op_type == "Loop":
            body: onnx.GraphProto = _attr(node, "body", None)
            for value in list(body.output)[1 + len(node.input) - 2 :]:
                value.type.tensor_type.ClearField("shape")
        for _, sub in _subgraphs(node):
            _clear_scan_shapes(sub)


def _undeclared_scan_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose Loop scan outputs declare no shape: the static-shape rule
    is checked on what shape inference derives from the body's nodes, not on a declaration."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _clear_scan_shapes(copy.graph)
    return copy


def check_tensorrt_graph(model: onnx.ModelProto) -> list[Violation]:
    """Every rule of ``tensorrt_onnx_support.json`` that a node of ``model`` breaks.

    Shapes and types come from onnx shape inference (subgraphs included), constants from
    initializers and Constant nodes of the node's graph and of the graphs around it.
    """
    rules = support()
    opset = _opset(model)
    found: list[Violation] = []
    low, high = rules["opset"]["min"], rules["opset"]["max"]
    if not low <= opset <= high:
        found.append(
            Violation("", "model", "", "op-supported", f"opset {opset} is outside {low}..{high}")
        )
    inferred = shape_inference.infer_shapes(_undeclared_scan_shapes(model), data_prop=True)
    scope = _Scope({}, {}, {}, "")
    scope.add(inferred.graph)
    found.extend(_walk(inferred.graph, scope))
    return found


def required_plugins(model: onnx.ModelProto) -> list[str]:
    """TensorRT plugins the parser will take from the registry for ``model`` (sorted)."""

    def ops(graph: onnx.GraphProto) -> Iterator[str]:
        for node in graph.node:
            yield node.op_type
            for _, sub in _subgraphs(node):
                yield from ops(sub)

    return sorted({PLUGINS[op] for op in ops(model.graph) if op in PLUGINS})


def describe(violations: list[Violation], limit: int = 5) -> str:
    """The first ``limit`` violations on one line, for an error message."""
    shown = "; ".join(str(v) for v in violations[:limit])
    more = f" (and {len(violations) - limit} more)" if len(violations) > limit else ""
    return f"{len(violations)} TensorRT rule violation(s): {shown}{more}"
