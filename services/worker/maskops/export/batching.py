"""A batch dimension for the traced one-image graph: an ONNX ``Loop`` over the images.

torch.onnx's TorchScript exporter records torchvision's per-image Python loops (anchor
generation, proposal filtering and NMS, detection post-processing; see
``torchvision.models.detection.rpn.RegionProposalNetwork.filter_proposals`` and
``roi_heads.RoIHeads.postprocess_detections``) unrolled for the example's number of
images, so a traced graph cannot take a batch whose size is known only at run time. The
exporter therefore traces one image and wraps that graph, unchanged, as the body of a
``Loop`` whose trip count is the input's first dimension: each iteration slices image
``i`` and its padded outputs, reshaped to their constant row shapes, are stacked as row
``i`` of the batched outputs. The Loop is given a constant-true condition input, which its
body reads: TensorRT's parser defines a body's condition only when the Loop has one, and
concatenates scan outputs only of one static shape per iteration. An image's
detections are thus computed by the very graph it would run alone, whatever else shares
its batch (tests/unit/export/test_batching.py checks N = 1, 2, 3).

The wrapping is the last step: fp16 conversion and int8 quantisation work on the
one-image graph (their tools look for weights among the top graph's initializers) and
the batched file carries the result.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import onnx
from onnx import TensorProto, helper

from maskops.export.graph import INPUT_NAME, OUTPUT_NAMES

BATCH_DIM = "batch"
"""The symbolic name of a dynamic batch dimension."""
_LOOP_NAME = "batch/over_images"
_BODY_PREFIX = "image/"
"""Prefix of the one-image graph's input and output names inside the loop body (a body
may not reuse a name of the graph it is in)."""


def _rename(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    """Rename values in every node of ``graph`` and of its subgraphs."""
    for node in graph.node:
        for position, name in enumerate(node.input):
            node.input[position] = renames.get(name, name)
        for position, name in enumerate(node.output):
            node.output[position] = renames.get(name, name)
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _rename(sub, renames)


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
            so the Loop's scan outputs have a static shape per iteration.
        static_batch_size: N fixed in the input shape; None leaves it dynamic.

    Returns:
        A model with input ``images [N, 3, H, W]`` and each output ``[N, ...]`` whose row
        ``i`` is what ``single`` returns for image ``i`` (without its leading 1); the
        metadata and opset of ``single`` are kept.
    """
    graph = single.graph
    batch: int | str = static_batch_size if static_batch_size is not None else BATCH_DIM
    images = next(value for value in graph.input if value.name == INPUT_NAME)
    outputs = {value.name: value for value in graph.output}
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
            body=_loop_body(graph, row_shapes),
        ),
    ]
    batched = helper.make_graph(
        nodes,
        f"{graph.name}_batched",
        [_batched_value(images, batch)],
        [_batched_value(outputs[name], batch, row_shapes[name]) for name in OUTPUT_NAMES],
        initializer=[
            helper.make_tensor(first, TensorProto.INT64, [], [0]),
            helper.make_tensor(cond, TensorProto.BOOL, [], [True]),
        ],
    )
    model = copy.deepcopy(single)
    model.graph.CopyFrom(batched)
    return model


def image_graph(model: onnx.ModelProto) -> onnx.GraphProto:
    """The one-image graph inside a batched export: the Loop's body (the top graph of a
    file exported before batching). Its nodes and initializers are the network's layers."""
    for node in model.graph.node:
        if node.op_type == "Loop" and node.name == _LOOP_NAME:
            return next(attr.g for attr in node.attribute if attr.name == "body")
    return model.graph
