"""TensorRT's ONNX import rules: each rule flags a hand-made graph that breaks it (naming
node, subgraph path and rule) and passes the same graph made right."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from maskops.export.exporter import ExportError, _check_for_tensorrt
from maskops.export.tensorrt import EngineBuildError, select_gpu
from maskops.export.tensorrt_rules import (
    TOPK_MAX_K,
    Violation,
    check_tensorrt_graph,
    required_plugins,
    support,
)


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _float(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _rules(violations: list[Violation]) -> set[tuple[str, str]]:
    return {(v.node, v.rule) for v in violations}


def _loop(*, cond: bool, scan_op: str, declared=None) -> onnx.ModelProto:
    """A Loop of N trips over ``x [4]`` whose body reads its condition; its scan output is
    ``x`` (static ``[4]``) through Identity, or NonZero(x) (data-dependent length), with
    the shape ``declared`` on the body's output."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node(scan_op, ["x"], ["row"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            _float("row", declared),
        ],
    )
    trips = numpy_helper.from_array(np.array(3, dtype=np.int64), "trips")
    true = numpy_helper.from_array(np.array(True), "true")
    loop = helper.make_node("Loop", ["trips", "true" if cond else ""], ["rows"], "loop", body=body)
    return _model([loop], [_float("x", [4])], [_float("rows", None)], [trips, true])


def test_loop_without_a_condition_input_is_flagged() -> None:
    violations = check_tensorrt_graph(_loop(cond=False, scan_op="Identity"))
    assert _rules(violations) == {("loop", "loop-condition")}
    assert "cond_in" in violations[0].message
    assert str(violations[0]).startswith("loop (Loop): rule loop-condition:")
    assert check_tensorrt_graph(_loop(cond=True, scan_op="Identity")) == []


def test_a_scan_output_of_data_dependent_shape_is_flagged() -> None:
    violations = check_tensorrt_graph(_loop(cond=True, scan_op="NonZero"))
    assert _rules(violations) == {("loop", "loop-scan-static")}
    assert "'row'" in violations[0].message
    # A static shape declared on the body's output is not taken on trust.
    declared = check_tensorrt_graph(_loop(cond=True, scan_op="NonZero", declared=[1, 4]))
    assert _rules(declared) == {("loop", "loop-scan-static")}


def _qdq(zero_point: np.ndarray | None, *, dq_input_type: int = TensorProto.INT8):
    """x -> QuantizeLinear -> DequantizeLinear, and a weight DequantizeLinear of
    ``dq_input_type``."""
    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "scale")
    inits = [scale]
    q_inputs = ["x", "scale"]
    if zero_point is not None:
        inits.append(numpy_helper.from_array(zero_point, "zero"))
        q_inputs.append("zero")
    weight = helper.make_tensor("w", dq_input_type, [2], [1, 2])
    nodes = [
        helper.make_node("QuantizeLinear", q_inputs, ["q"], "quant"),
        helper.make_node("DequantizeLinear", ["q", *q_inputs[1:]], ["y"], "dq"),
        helper.make_node("DequantizeLinear", ["w", "scale"], ["w_float"], "dq_weight"),
    ]
    return _model(
        nodes, [_float("x", [2])], [_float("y", [2]), _float("w_float", [2])], [*inits, weight]
    )


def test_qdq_must_be_int8_with_zero_point_zero() -> None:
    assert check_tensorrt_graph(_qdq(np.array(0, dtype=np.int8))) == []
    uint8 = check_tensorrt_graph(_qdq(np.array(128, dtype=np.uint8)))
    assert _rules(uint8) == {("quant", "qdq-int8-symmetric"), ("dq", "qdq-int8-symmetric")}
    assert "UINT8, not INT8" in uint8[0].message
    asymmetric = check_tensorrt_graph(_qdq(np.array(3, dtype=np.int8)))
    assert {v.node for v in asymmetric} == {"quant", "dq"}
    assert all("not all zeros" in v.message for v in asymmetric)
    no_zero_point = check_tensorrt_graph(_qdq(None))
    assert ("quant", "qdq-int8-symmetric") in _rules(no_zero_point)
    int32_bias = check_tensorrt_graph(
        _qdq(np.array(0, dtype=np.int8), dq_input_type=TensorProto.INT32)
    )
    assert _rules(int32_bias) == {("dq_weight", "qdq-int8-symmetric")}
    assert "INT32" in int32_bias[0].message


def test_unsupported_ops_domains_and_opsets_are_flagged() -> None:
    assert support()["operators"]["Unique"]["supported"] is False
    nodes = [
        helper.make_node("Unique", ["x"], ["u"], "unique"),
        helper.make_node("Relu", ["x"], ["r"], "custom", domain="com.example"),
        helper.make_node("Relu", ["x"], ["fine"], "relu"),
    ]
    model = _model(
        nodes, [_float("x", [4])], [_float("u", None), _float("r", [4]), _float("fine", [4])]
    )
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    assert _rules(check_tensorrt_graph(model)) == {
        ("unique", "op-supported"),
        ("custom", "op-supported"),
    }
    newer = _model([nodes[2]], [_float("x", [4])], [_float("fine", [4])], opset=21)
    assert [(v.op_type, v.rule) for v in check_tensorrt_graph(newer)] == [("model", "op-supported")]


def _topk(k_value: int | None, *, sorted_: int = 1) -> onnx.ModelProto:
    """TopK of ``x [5000]`` with a constant K, or (None) K from the input's own values."""
    nodes = []
    inits = []
    if k_value is None:
        nodes.append(
            helper.make_node("Cast", ["k_float"], ["k"], "k_at_run_time", to=TensorProto.INT64)
        )
        inputs = [_float("x", [5000]), _float("k_float", [1])]
    else:
        inits.append(numpy_helper.from_array(np.array([k_value], dtype=np.int64), "k"))
        inputs = [_float("x", [5000])]
    nodes.append(helper.make_node("TopK", ["x", "k"], ["v", "i"], "topk", sorted=sorted_))
    outputs = [_float("v", None), helper.make_tensor_value_info("i", TensorProto.INT64, None)]
    return _model(nodes, inputs, outputs, inits)


def test_topk_k_below_the_limit_and_sorted() -> None:
    assert check_tensorrt_graph(_topk(TOPK_MAX_K - 1)) == []
    too_many = check_tensorrt_graph(_topk(TOPK_MAX_K))
    assert _rules(too_many) == {("topk", "topk")} and "3840" in too_many[0].message
    assert _rules(check_tensorrt_graph(_topk(10, sorted_=0))) == {("topk", "topk")}
    # TensorRT 10's importer takes K as a tensor: a run-time K is no violation.
    assert check_tensorrt_graph(_topk(None)) == []


def test_nested_violations_name_their_subgraph_path() -> None:
    """A Slice with run-time axes inside an If inside a Loop body."""
    branch = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"], "shape"),
            helper.make_node("Slice", ["x", "start", "end", "shape"], ["sliced"], "slice"),
        ],
        "then",
        [],
        [_float("sliced", None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["same"], "same")], "else", [], [_float("same", None)]
    )
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node(
                "If", ["flag"], ["picked"], "pick", then_branch=branch, else_branch=other
            ),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _float("picked", [4])],
    )
    inits = [
        numpy_helper.from_array(np.array(2, dtype=np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "true"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "start"),
        numpy_helper.from_array(np.array([4], dtype=np.int64), "end"),
    ]
    loop = helper.make_node("Loop", ["trips", "true"], ["rows"], "loop", body=body)
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    model = _model([loop], [_float("x", [4]), flag], [_float("rows", None)], inits)
    violations = check_tensorrt_graph(model)
    # The slice's run-time axes also leave the Loop's row without a static shape.
    assert _rules(violations) == {("slice", "axes-constant"), ("loop", "loop-scan-static")}
    (violation,) = [v for v in violations if v.node == "slice"]
    assert (violation.node, violation.op_type, violation.rule) == (
        "slice",
        "Slice",
        "axes-constant",
    )
    assert violation.path == "loop.body/pick.then_branch"
    assert str(violation).startswith("loop.body/pick.then_branch/slice (Slice): rule axes-constant")


def test_plugins_are_listed_and_export_refuses_a_violation(tmp_path: Path) -> None:
    rois = _float("rois", [3, 4])
    index = helper.make_tensor_value_info("index", TensorProto.INT64, [3])
    align = helper.make_node("RoiAlign", ["x", "rois", "index"], ["pooled"], "align")
    model = _model([align], [_float("x", [1, 8, 16, 16]), rois, index], [_float("pooled", None)])
    assert required_plugins(model) == ["ROIAlign_TRT"]
    logged: list[str] = []
    assert _check_for_tensorrt(model, tmp_path / "m.onnx", logged.append) == ["ROIAlign_TRT"]
    assert "ROIAlign_TRT" in logged[0]
    with pytest.raises(
        ExportError, match=r"m\.onnx: TensorRT cannot import .*loop \(Loop\): rule loop-condition"
    ):
        _check_for_tensorrt(_loop(cond=False, scan_op="Identity"), tmp_path / "m.onnx", print)


def test_the_support_file_names_its_source() -> None:
    source = support()["source"]
    assert "onnx-tensorrt" in source["document"] and source["taken"]
    assert "TensorRT" in source["header"] or source["tensorrt"]
    assert set(support()["rules"]) >= {
        "op-supported",
        "loop-condition",
        "loop-scan-static",
        "qdq-int8-symmetric",
        "topk",
    }


def test_a_gpu_index_that_does_not_exist_is_refused() -> None:
    import torch

    with pytest.raises(EngineBuildError, match="--gpu_index 64"):
        select_gpu(64)
    assert torch.cuda.device_count() < 64
