"""Fold the traced graph's shape arithmetic into constants.

The one-image graph's input is ``[1, 3, H, W]`` with H and W fixed, so every ``Shape`` of a
tensor whose dimensions follow from the input alone (the backbone's and FPN's feature
maps, the anchors) is a constant, and so is the arithmetic on it: the RPN's per-level
``TopK`` keeps ``min(pre_nms_top_n, anchors in the level)`` boxes, a number torch.onnx
records as Shape -> Gather -> Min -> Reshape. Evaluated once here, such a ``K`` becomes a
``Constant`` that a reader of the graph (TensorRT's parser, :mod:`maskops.export.tensorrt_rules`)
can check against its limits. What depends on the image's content (``NonZero``,
``NonMaxSuppression`` and everything after them) has no static shape and stays as it is.

Each folded node is replaced by a ``Constant`` with the same output name, so the graph's
value names do not change; nodes that nothing reads any more are dropped.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator

from maskops.export.graph import subgraphs, used_names

MAX_FOLDED_ELEMENTS = 4096
"""Only small values are folded: shape arithmetic, not weights or feature maps."""
_NOT_FOLDED = frozenset({"If", "Loop", "Scan", "RandomNormal", "RandomUniform"})
"""Control flow (subgraphs) and non-deterministic ops are never evaluated here."""


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Value name -> shape, for the values of the top graph whose every dimension is known."""
    inferred = shape_inference.infer_shapes(model, data_prop=True)
    graph = inferred.graph
    shapes: dict[str, list[int]] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        dims = tensor.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [int(d.dim_value) for d in dims]
    return shapes


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values known without running the graph: initializers and Constant node outputs."""
    known = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            known[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return known


def _evaluate(node: onnx.NodeProto, known: dict[str, np.ndarray], opset: int) -> list[np.ndarray]:
    """``node``'s outputs from the known values of its inputs (onnx's reference runtime)."""
    inputs = [name for name in node.input if name]
    graph = onnx.helper.make_graph(
        [node],
        "fold",
        [
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
            for name in inputs
        ],
        [
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
            for name in node.output
        ],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    results = ReferenceEvaluator(model).run(None, {name: known[name] for name in inputs})
    return [np.asarray(value) for value in results]


def _constant_node(name: str, value: np.ndarray, source: onnx.NodeProto) -> onnx.NodeProto:
    return onnx.helper.make_node(
        "Constant",
        [],
        [name],
        name=f"{source.name or name}/folded",
        value=numpy_helper.from_array(value, name),
    )


def _fold_value(
    node: onnx.NodeProto, known: dict[str, np.ndarray], shapes: dict[str, list[int]], opset: int
) -> list[np.ndarray] | None:
    """``node``'s output values when they follow from known values and static shapes."""
    if node.op_type == "Shape":
        static = shapes.get(node.input[0])
        return None if static is None or node.attribute else [np.asarray(static, dtype=np.int64)]
    inputs = [name for name in node.input if name]
    if (
        node.op_type in _NOT_FOLDED
        or node.op_type == "Constant"
        or node.domain not in ("", "ai.onnx")
        or not inputs
        or not all(name in known and known[name].size <= MAX_FOLDED_ELEMENTS for name in inputs)
    ):
        return None
    try:
        values = _evaluate(node, known, opset)
    except Exception:  # an op the reference runtime lacks stays a node; nothing is lost
        return None
    return None if any(value.size > MAX_FOLDED_ELEMENTS for value in values) else values


def _fold_graph(
    graph: onnx.GraphProto,
    known: dict[str, np.ndarray],
    shapes: dict[str, list[int]],
    opset: int,
) -> int:
    """Fold ``graph``'s nodes (and its subgraphs', which see its values); returns how many."""
    known = {**known, **_constants(graph)}
    folded = 0
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for sub in subgraphs(node):
            folded += _fold_graph(sub, known, {}, opset)
        values = _fold_value(node, known, shapes, opset)
        if values is None:
            nodes.append(node)
            continue
        folded += 1
        for name, value in zip(node.output, values, strict=True):
            known[name] = value
            nodes.append(_constant_node(name, value, node))
    del graph.node[:]
    graph.node.extend(nodes)
    return folded


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove nodes whose outputs nothing reads (repeatedly: chains die together), in
    ``graph`` and its subgraphs."""
    for node in graph.node:
        for sub in subgraphs(node):
            _drop_unread(sub)
    while True:
        read = used_names(graph) | {value.name for value in graph.output}
        kept = [node for node in graph.node if any(name in read for name in node.output)]
        if len(kept) == len(graph.node):
            return
        del graph.node[:]
        graph.node.extend(kept)


def fold_shape_arithmetic(model: onnx.ModelProto, *, max_passes: int = 8) -> onnx.ModelProto:
    """A copy of the one-image ``model`` with its input-determined shape arithmetic folded.

    Passes repeat until nothing more folds (a folded value can make a later shape static);
    the result computes the same outputs as ``model`` for every ``[1, 3, H, W]`` input.
    """
    model = copy.deepcopy(model)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for _ in range(max_passes):
        if not _fold_graph(model.graph, {}, _static_shapes(model), opset):
            break
    _drop_unread(model.graph)
    return model
