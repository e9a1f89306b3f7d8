"""A batch dimension for the traced one-image graph: a ``Loop`` over the images, or, for
a fixed batch, the one-image graph repeated once per image.

torch.onnx's TorchScript exporter records torchvision's per-image Python loops (anchor
generation, proposal filtering and NMS, detection post-processing; see
``torchvision.models.detection.rpn.RegionProposalNetwork.filter_proposals`` and
``roi_heads.RoIHeads.postprocess_detections``) unrolled for the example's number of
images, so a traced graph cannot take a batch whose size is known only at run time. The
exporter therefore traces one image and batches that graph, unchanged:

- **dynamic batch**: the graph is the body of a ``Loop`` whose trip count is the input's
  first dimension. Each iteration slices image ``i``, and its padded outputs, reshaped to
  their constant row shapes, are stacked as row ``i`` of the batched outputs. The Loop is
  given a constant-true condition input, which its body reads: TensorRT's parser defines
  a body's condition only when the Loop has one, and concatenates scan outputs only of one
  static shape per iteration.
- **static batch** (``--static_batch_size N``): the graph is repeated N times side by side,
  copy ``i`` reading image ``i``; the weights are stored once. No ``Loop`` remains, so the
  layers whose output size depends on the data (NonZero, NonMaxSuppression, the
  proposals' TopK) sit in the top-level network, where TensorRT's documentation covers
  them, rather than inside a TensorRT loop, where it does not say they work. N = 1 (what
  DeepStream's ``batch-size=1`` runs) is a single copy.

Either way an image's detections are computed by the very graph it would run alone,
whatever else shares its batch (tests/unit/export/test_batching.py checks N = 1, 2, 3).

The batching is the last step: fp16 conversion and int8 quantisation work on the
one-image graph (their tools look for weights among the top graph's initializers) and
the batched file carries the result.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import onnx
from onnx import TensorProto, helper

from maskops.export.graph import INPUT_NAME, OUTPUT_NAMES, subgraphs

BATCH_DIM = "batch"
"""The symbolic name of a dynamic batch dimension."""
_LOOP_NAME = "batch/over_images"
_AXIS0 = "batch/axis0"
_BODY_PREFIX = "image/"
"""Prefix of the one-image graph's input and output names inside the loop body (a body
may not reuse a name of the graph it is in)."""


def _rename(graph: onnx.GraphProto, renames: Mapping[str, str]) -> None:
    """Rename values in every node of ``graph`` and of its subgraphs, and the subgraphs'
    own inputs, outputs and value infos."""
    for node in graph.node:
        for position, name in enumerate(node.input):
            node.input[position] = renames.get(name, name)
        for position, name in enumerate(node.output):
            node.output[position] = renames.get(name, name)
        for sub in subgraphs(node):
            for value in (*sub.input, *sub.output, *sub.value_info):
                value.name = renames.get(value.name, value.name)
            _rename(sub, renames)


def _prefix_node_names(graph: onnx.GraphProto, prefix: str) -> None:
    """Prefix the names of the nodes of ``graph`` and of its subgraphs (a model's node
    names must be unique)."""
    for node in graph.node:
        if node.name:
            node.name = prefix + node.name
        for sub in subgraphs(node):
            _prefix_node_names(sub, prefix)


def _prefix_dim_params(graph: onnx.GraphProto, prefix: str) -> None:
    """Prefix the symbolic dimensions of the value infos of ``graph`` and of its subgraphs
    (and the subgraphs' inputs and outputs).

    onnxruntime takes two values whose dimensions share a symbol to have the same size,
    and may plan one's buffer for the other: copies of one image graph that kept the same
    symbols for their data-dependent sizes (detections kept) failed when two images kept
    different numbers ("Shape mismatch attempting to re-use buffer").
    """
    values = [*graph.value_info]
    for node in graph.node:
        for sub in subgraphs(node):
            values += [*sub.input, *sub.output]
            _prefix_dim_params(sub, prefix)
    for value in values:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                dim.dim_param = prefix + dim.dim_param


def _defined_names(graph: onnx.GraphProto) -> set[str]:
    """Every value the nodes of ``graph`` and of its subgraphs define (outputs and
    subgraph inputs), not the graph's own inputs and initializers."""
    names: set[str] = set()
    for node in graph.node:
        names.update(name for name in node.output if name)
        for sub in subgraphs(node):
            names.update(value.name for value in sub.input)
            names |= _defined_names(sub)
    return names


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    tensor = helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
    return helper.make_node("Constant", [], [name], name=name, value=tensor)


def _inner(name: str) -> str:
    """A value name of the loop body."""
    return f"{_BODY_PREFIX}{name}"


def _loop_body(single: onnx.GraphProto, row_shapes: Mapping[str, Sequence[int]]) -> onnx.GraphProto:
    """``single`` as a Loop body: slice image ``i`` of the outer ``images``, run it, and
    reshape each output to its row shape (the Loop stacks the rows into ``[N, ...]``)."""
    body = copy.deepcopy(single)
    _rename(body, {name: _inner(name) for name in (INPUT_NAME, *OUTPUT_NAMES)})
    step, cond = _inner("i"), _inner("cond")
    one, axis0 = _inner("one"), _inner("axis0")
    slicing = [
        _const(one, [1]),
        _const(axis0, [0]),
        helper.make_node("Reshape", [step, one], [_inner("start")]),
        helper.make_node("Add", [_inner("start"), one], [_inner("end")]),
        helper.make_node(
            "Slice", [INPUT_NAME, _inner("start"), _inner("end"), axis0], [_inner(INPUT_NAME)]
        ),
    ]
    # Reshape each output to its row shape, a constant: TensorRT concatenates a Loop's scan
    # outputs only when every iteration's row has the same, statically known shape (the
    # traced pad to D rows is data-dependent, so shape inference cannot see it).
    unbatch: list[onnx.NodeProto] = []
    for name in OUTPUT_NAMES:
        shape = _inner(f"{name}/row_shape")
        unbatch += [
            _const(shape, list(row_shapes[name])),
            helper.make_node("Reshape", [_inner(name), shape], [_inner(f"{name}/row")]),
        ]
    nodes = [*slicing, *body.node, *unbatch, helper.make_node("Identity", [cond], [f"{cond}/out"])]
    del body.node[:]
    body.node.extend(nodes)
    del body.input[:]
    body.input.extend(
        [
            helper.make_tensor_value_info(step, TensorProto.INT64, []),
            helper.make_tensor_value_info(cond, TensorProto.BOOL, []),
        ]
    )
    types = {value.name: value.type.tensor_type.elem_type for value in single.output}
    del body.output[:]
    body.output.append(helper.make_tensor_value_info(f"{cond}/out", TensorProto.BOOL, []))
    body.output.extend(
        helper.make_tensor_value_info(_inner(f"{name}/row"), types[name], list(row_shapes[name]))
        for name in OUTPUT_NAMES
    )
    body.name = "one_image"
    return body


def _batched_value(
    value: onnx.ValueInfoProto, batch: int | str, row: Sequence[int] | None = None
) -> onnx.ValueInfoProto:
    """``value`` with its first dimension replaced by ``batch`` (and the others by ``row``)."""
    batched = copy.deepcopy(value)
    dims = batched.type.tensor_type.shape.dim
    if row is not None:
        del dims[1:]
        for size in row:
            dims.add().dim_value = size
    first = dims[0]
    first.Clear()
    if isinstance(batch, int):
        first.dim_value = batch
    else:
        first.dim_param = batch
    return batched


def _image_copy(
    graph: onnx.GraphProto, index: int, defined: set[str]
) -> tuple[list[onnx.NodeProto], list[onnx.ValueInfoProto]]:
    """The nodes (and value infos) of ``graph`` as copy ``index`` of a static batch: its
    values and nodes prefixed ``image{index}/``, reading that image's slice of ``images``
    and ending in each output's row. The initializers are left to be shared."""
    prefix = f"image{index}/"
    renames = {name: prefix + name for name in defined}
    nodes_only = onnx.GraphProto(node=graph.node, value_info=graph.value_info)
    _rename(nodes_only, renames)
    _prefix_node_names(nodes_only, prefix)
    _prefix_dim_params(nodes_only, prefix)
    for value in nodes_only.value_info:
        value.name = renames.get(value.name, value.name)
    bounds = [f"batch/start{index}", f"batch/end{index}"]
    slicing = helper.make_node("Slice", [INPUT_NAME, *bounds, _AXIS0], [renames[INPUT_NAME]])
    # Each output reshaped to its constant row shape: the traced pad to D rows is
    # data-dependent, so shape inference cannot see that every copy's row has one shape.
    rows = [
        helper.make_node("Reshape", [renames[name], _row_shape(name)], [f"{prefix}{name}/row"])
        for name in OUTPUT_NAMES
    ]
    return [slicing, *nodes_only.node, *rows], list(nodes_only.value_info)


def _row_shape(output: str) -> str:
    return f"batch/{output}/row_shape"


def _unrolled(
    single: onnx.ModelProto, row_shapes: Mapping[str, Sequence[int]], batch_size: int
) -> onnx.GraphProto:
    """``single``'s graph repeated ``batch_size`` times (:func:`_image_copy`), the
    initializers stored once; each output concatenates the copies' rows."""
    graph = single.graph
    defined = _defined_names(graph) | {INPUT_NAME}
    initializers = [*graph.initializer, helper.make_tensor(_AXIS0, TensorProto.INT64, [1], [0])]
    initializers += [
        helper.make_tensor(_row_shape(name), TensorProto.INT64, [len(shape) + 1], [1, *shape])
        for name, shape in row_shapes.items()
    ]
    nodes: list[onnx.NodeProto] = []
    value_info: list[onnx.ValueInfoProto] = []
    for i in range(batch_size):
        initializers += [
            helper.make_tensor(f"batch/start{i}", TensorProto.INT64, [1], [i]),
            helper.make_tensor(f"batch/end{i}", TensorProto.INT64, [1], [i + 1]),
        ]
        copy_nodes, copy_values = _image_copy(graph, i, defined)
        nodes += copy_nodes
        value_info += copy_values
    nodes += [
        helper.make_node(
            "Concat", [f"image{i}/{name}/row" for i in range(batch_size)], [name], axis=0
        )
        for name in OUTPUT_NAMES
    ]
    return helper.make_graph(
        nodes,
        f"{graph.name}_x{batch_size}",
        [],
        [],
        initializer=initializers,
        value_info=value_info,
    )


def _looped(single: onnx.ModelProto, row_shapes: Mapping[str, Sequence[int]]) -> onnx.GraphProto:
    """A Loop over the input's first dimension, ``single`` its body."""
    trips, first, cond = "batch/trips", "batch/first", "batch/cond"
    nodes = [
        helper.make_node("Shape", [INPUT_NAME], ["batch/shape"]),
        helper.make_node("Gather", ["batch/shape", first], [trips], name="batch/size", axis=0),
        helper.make_node(
            "Loop",
            # A real condition (constant true): the body reads its condition input, and
            # TensorRT's parser defines that input only when the Loop is given one.
            [trips, cond],
            list(OUTPUT_NAMES),
            name=_LOOP_NAME,
            body=_loop_body(single.graph, row_shapes),
        ),
    ]
    initializers = [
        helper.make_tensor(first, TensorProto.INT64, [], [0]),
        helper.make_tensor(cond, TensorProto.BOOL, [], [True]),
    ]
    name = f"{single.graph.name}_batched"
    return helper.make_graph(nodes, name, [], [], initializer=initializers)


def batch_over_images(
    single: onnx.ModelProto,
    *,
    row_shapes: Mapping[str, Sequence[int]],
    static_batch_size: int | None = None,
) -> onnx.ModelProto:
    """The one-image graph ``single`` (input ``[1, 3, H, W]``) as a graph of N images.

    Args:
        single: the traced (and possibly fp16/int8) one-image graph of the contract in
            :mod:`maskops.export.graph`.
        row_shapes: each output's shape for one image
            (:func:`maskops.export.graph.output_row_shapes`): the rows are reshaped to it,
            so every output has a static shape but for N.
        static_batch_size: N fixed in the input shape (the graph repeated N times, no
            Loop); None leaves N dynamic (a Loop).

    Returns:
        A model with input ``images [N, 3, H, W]`` and each output ``[N, ...]`` whose row
        ``i`` is what ``single`` returns for image ``i`` (without its leading 1); the
        metadata and opset of ``single`` are kept.
    """
    if static_batch_size is not None and static_batch_size < 1:
        raise ValueError(f"static_batch_size must be at least 1, got {static_batch_size}")
    batch: int | str = static_batch_size if static_batch_size is not None else BATCH_DIM
    images = next(value for value in single.graph.input if value.name == INPUT_NAME)
    outputs = {value.name: value for value in single.graph.output}
    if static_batch_size is None:
        batched = _looped(single, row_shapes)
    else:
        batched = _unrolled(single, row_shapes, static_batch_size)
    batched.input.append(_batched_value(images, batch))
    batched.output.extend(
        _batched_value(outputs[name], batch, row_shapes[name]) for name in OUTPUT_NAMES
    )
    model = copy.deepcopy(single)
    model.graph.CopyFrom(batched)
    return model


def image_graph(model: onnx.ModelProto) -> onnx.GraphProto:
    """The graph holding a batched export's layers: the Loop's body of a dynamic batch;
    the top graph otherwise (a static batch, one copy per image sharing the initializers,
    or a file exported before batching)."""
    for node in model.graph.node:
        if node.op_type == "Loop" and node.name == _LOOP_NAME:
            return next(attr.g for attr in node.attribute if attr.name == "body")
    return model.graph
