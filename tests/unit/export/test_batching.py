"""The batched graph: image i's outputs in a batch of N are what it gives alone, and the
TensorRT profile follows the batch flags."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from maskops.data.labels import LabelMap
from maskops.export import OUTPUT_NAMES, GraphMetadata, OnnxPredictor
from maskops.export.batching import batch_over_images, image_graph
from maskops.export.graph import graph_batch_size, output_row_shapes, trace_to_onnx
from maskops.export.precision import convert_to_fp16, quantize_int8
from maskops.export.tensorrt import (
    BatchProfile,
    EngineBuildError,
    batch_profile,
    build_engine,
    onnx_engine_inputs,
)
from maskops.modeling import build_model
from maskops.serving.triton_models.maskops_serving_ops import run_batched
from maskops.spec.models import ExperimentSpec, MaskRCNNConfig
from tests.support.gpu import needs_tensorrt

SIZE = (64, 64)
DETECTIONS = 8
ROWS = output_row_shapes(DETECTIONS, MaskRCNNConfig().mrcnn_resolution)


@pytest.fixture(scope="module")
def one_image_graph() -> onnx.ModelProto:
    """A randomly initialised resnet10 traced on one image; every box is kept (score
    threshold 0), so each image has detections to compare."""
    torch.manual_seed(0)
    config = MaskRCNNConfig(
        nlayers=10, min_level=3, max_level=5, test_detections_per_image=DETECTIONS
    )
    model = build_model(config, num_classes=3, image_size=SIZE).eval()
    model.roi_heads.score_thresh = 0.0
    return trace_to_onnx(model, image_size=SIZE, max_detections=DETECTIONS)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _images(count: int) -> np.ndarray:
    # Different images: the rows of a batch must not be copies of one another.
    return np.random.default_rng(1).random((count, 3, *SIZE), dtype=np.float32)


def test_each_image_of_a_batch_gets_what_it_gets_alone(one_image_graph):
    batched = batch_over_images(one_image_graph, row_shapes=ROWS)
    onnx.checker.check_model(batched, full_check=True)
    assert graph_batch_size(batched) is None
    assert image_graph(one_image_graph) is one_image_graph.graph
    assert {n.op_type for n in image_graph(batched).node} >= {"Conv", "RoiAlign"}
    alone, together = _session(one_image_graph), _session(batched)
    images = _images(3)
    single = [alone.run(list(OUTPUT_NAMES), {"images": images[i : i + 1]}) for i in range(3)]
    assert all(run[4][0, 0] > 0 for run in single)
    # Distinct images, distinct detections: a loop that read the wrong image would fail.
    assert not np.allclose(single[0][0], single[1][0]) and not np.allclose(
        single[1][0], single[2][0]
    )
    for count in (1, 2, 3):
        outputs = together.run(list(OUTPUT_NAMES), {"images": images[:count]})
        for name, output in zip(OUTPUT_NAMES, outputs, strict=True):
            assert output.shape[0] == count, name
            for i in range(count):
                np.testing.assert_allclose(
                    output[i], single[i][OUTPUT_NAMES.index(name)][0], atol=1e-5
                )
    assert single[0][0].shape == (1, DETECTIONS, 4)


@pytest.mark.parametrize("static_batch_size", [None, 2])
@pytest.mark.parametrize("data_type", ["fp16", "int8"])
def test_reduced_precision_graphs_batch_the_same_way(
    one_image_graph, tmp_path, data_type, static_batch_size
):
    """fp16 and int8 convert the one-image graph; the batch (a Loop, or a copy per image)
    carries the converted graph."""
    images = _images(2)
    if data_type == "fp16":
        converted = convert_to_fp16(one_image_graph)
    else:
        calibration = [torch.from_numpy(image) for image in images]
        converted, _ = quantize_int8(one_image_graph, calibration, work_dir=tmp_path)
    batched = batch_over_images(converted, row_shapes=ROWS, static_batch_size=static_batch_size)
    ops = {n.op_type for n in image_graph(batched).node}
    assert ("QuantizeLinear" if data_type == "int8" else "Cast") in ops
    alone, together = _session(converted), _session(batched)
    outputs = together.run(list(OUTPUT_NAMES), {"images": images})
    for i in range(2):
        want = alone.run(list(OUTPUT_NAMES), {"images": images[i : i + 1]})
        for got, expected in zip(outputs, want, strict=True):
            np.testing.assert_allclose(got[i], expected[0], atol=1e-5)


def _dim_params(graph: onnx.GraphProto) -> list[str]:
    """The symbolic dimensions of ``graph``'s value infos and of its subgraphs' values."""
    values = [*graph.value_info]
    symbols = []
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                values += [*attribute.g.input, *attribute.g.output]
                symbols += _dim_params(attribute.g)
    for value in values:
        symbols += [d.dim_param for d in value.type.tensor_type.shape.dim if d.dim_param]
    return symbols


def test_the_copies_of_a_static_batch_share_no_symbolic_size(one_image_graph):
    """Each copy's data-dependent sizes (boxes kept, detections) have their own symbols:
    onnxruntime gives values of one symbol one size, and reused one copy's buffer for the
    other's, failing when two images kept different numbers of boxes (int8, AVX2)."""
    assert _dim_params(one_image_graph.graph), "no symbolic size to keep apart"
    batched = batch_over_images(one_image_graph, row_shapes=ROWS, static_batch_size=2)
    by_copy: dict[str, set[str]] = {}
    for symbol in _dim_params(batched.graph):
        copy, _, _ = symbol.partition("/")
        assert copy in ("image0", "image1"), symbol
        by_copy.setdefault(copy, set()).add(symbol.partition("/")[2])
    assert by_copy["image0"] == by_copy["image1"]


@pytest.mark.parametrize("count", [1, 3])
def test_a_static_batch_repeats_the_image_graph_without_a_loop(one_image_graph, count):
    """A fixed batch holds one copy of the image graph per image (the weights once), so the
    layers of data-dependent size are outside any Loop; each row is that image's alone."""
    from maskops.export.folding import fold_shape_arithmetic
    from maskops.export.tensorrt_rules import check_tensorrt_graph

    folded = fold_shape_arithmetic(one_image_graph)
    batched = batch_over_images(folded, row_shapes=ROWS, static_batch_size=count)
    onnx.checker.check_model(batched, full_check=True)
    ops = [node.op_type for node in batched.graph.node]
    assert "Loop" not in ops and graph_batch_size(batched) == count
    assert ops.count("RoiAlign") == count * [n.op_type for n in folded.graph.node].count("RoiAlign")
    assert len(batched.graph.initializer) < len(folded.graph.initializer) + 3 * count + 8
    assert check_tensorrt_graph(batched) == []
    inferred = onnx.shape_inference.infer_shapes(batched).graph.output
    for value in inferred:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        assert dims == [count, *ROWS[value.name]], value.name
    images = _images(count)
    alone, together = _session(folded), _session(batched)
    outputs = together.run(list(OUTPUT_NAMES), {"images": images})
    for i in range(count):
        want = alone.run(list(OUTPUT_NAMES), {"images": images[i : i + 1]})
        assert want[4][0, 0] > 0
        for got, expected in zip(outputs, want, strict=True):
            np.testing.assert_array_equal(got[i], expected[0])


def test_static_batch_and_the_predictor_fills_it(one_image_graph):
    batched = batch_over_images(one_image_graph, row_shapes=ROWS, static_batch_size=2)
    assert graph_batch_size(batched) == 2
    with pytest.raises(Exception, match="images"):  # onnxruntime refuses another batch
        _session(batched).run(list(OUTPUT_NAMES), {"images": _images(3)})
    metadata = GraphMetadata(
        spec=ExperimentSpec(),
        label_map=LabelMap.from_coco_categories([{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]),
        data_type="fp32",
        image_size=SIZE,
        max_detections=DETECTIONS,
        mask_resolution=28,
        max_batch_size=2,
        batch_size=2,
    )
    predictor = OnnxPredictor(batched.SerializeToString(), metadata=metadata)
    images = [torch.from_numpy(image) for image in _images(3)]
    got = predictor(images)  # runs 2, then 1 filled with a zero image
    alone = _session(one_image_graph)
    assert len(got) == 3
    for image, output in zip(images, got, strict=True):
        want = alone.run(list(OUTPUT_NAMES), {"images": image[None].numpy()})
        count = int(want[4][0, 0])
        assert output["scores"].shape == (count,)
        np.testing.assert_allclose(output["boxes"].numpy(), want[0][0, :count], atol=1e-5)


def test_run_batched_fills_and_drops_rows():
    seen: list[int] = []

    def run(batch: np.ndarray) -> list[np.ndarray]:
        seen.append(len(batch))
        return [batch.sum(axis=(1, 2, 3))]

    images = np.arange(5 * 3 * 2 * 2, dtype=np.float32).reshape(5, 3, 2, 2) + 1
    (static,) = run_batched(run, images, 2)
    assert seen == [2, 2, 2]
    np.testing.assert_array_equal(static, images.sum(axis=(1, 2, 3)))
    (dynamic,) = run_batched(run, images, None)
    assert seen[-1] == 5 and np.array_equal(dynamic, static)


def test_engine_inputs_read_the_batch(one_image_graph, tmp_path):
    for batch, want in ((None, None), (3, 3)):
        path = tmp_path / f"{want}.onnx"
        onnx.save(
            batch_over_images(one_image_graph, row_shapes=ROWS, static_batch_size=batch), str(path)
        )
        inputs = onnx_engine_inputs(path)
        assert (inputs.image_size, inputs.batch, inputs.is_qdq) == (SIZE, want, False)


@pytest.mark.parametrize(
    ("graph_batch", "flags", "want"),
    [
        (None, {"max_batch_size": 8}, BatchProfile(1, 8, 8)),
        (
            None,
            {"max_batch_size": 8, "min_batch_size": 2, "opt_batch_size": 4},
            BatchProfile(2, 4, 8),
        ),
        (None, {"max_batch_size": 1}, BatchProfile(1, 1, 1)),
        (4, {"max_batch_size": 4}, BatchProfile(4, 4, 4)),
        (4, {"max_batch_size": 4, "opt_batch_size": 4}, BatchProfile(4, 4, 4)),
    ],
)
def test_batch_profile(graph_batch, flags, want):
    assert batch_profile(graph_batch, **flags) == want
    assert want.shapes(SIZE)[2] == (want.max, 3, *SIZE)


@pytest.mark.parametrize(
    ("graph_batch", "flags", "message"),
    [
        (None, {"max_batch_size": 4, "min_batch_size": 5}, "min <= opt <= max"),
        (None, {"max_batch_size": 4, "opt_batch_size": 8}, "min <= opt <= max"),
        (None, {"max_batch_size": 4, "min_batch_size": 0}, "at least 1"),
        (2, {"max_batch_size": 4}, "--max_batch_size 4: the ONNX has a static batch of 2"),
        (2, {"max_batch_size": 2, "min_batch_size": 1}, "--min_batch_size 1: the ONNX"),
    ],
)
def test_batch_profile_refuses(graph_batch, flags, message):
    with pytest.raises(EngineBuildError, match=message):
        batch_profile(graph_batch, **flags)


@needs_tensorrt
@pytest.mark.parametrize(
    ("static_batch_size", "profile"), [(None, BatchProfile(1, 2, 4)), (2, BatchProfile(2, 2, 2))]
)
def test_engine_with_a_batch_profile(
    one_image_graph, tmp_path, static_batch_size, profile
):  # pragma: no cover - GPU only
    from maskops.export.folding import fold_shape_arithmetic

    path = tmp_path / "model.onnx"
    # Folded as the exporter does: unfolded, the NMS branches' Slice axes are not constants.
    folded = fold_shape_arithmetic(one_image_graph)
    batched = batch_over_images(folded, row_shapes=ROWS, static_batch_size=static_batch_size)
    onnx.save(batched, str(path))
    engine = build_engine(
        path, tmp_path / "model.plan", data_type="fp32", image_size=SIZE, profile=profile
    )
    assert engine.stat().st_size > 0


def test_portable_int8_breaks_tensorrt_rules_and_gen_trt_engine_refuses_it(
    one_image_graph, tmp_path, capsys
):
    """The onnxruntime int8 (uint8 activations, zero points off 0, int32 biases) breaks
    TensorRT's Q/DQ rule; the symmetric form of the same graph passes every rule."""
    from maskops.cli.main import main
    from maskops.export.folding import fold_shape_arithmetic
    from maskops.export.tensorrt_rules import check_tensorrt_graph

    folded = fold_shape_arithmetic(one_image_graph)
    calibration = [torch.from_numpy(image) for image in _images(2)]
    portable, _ = quantize_int8(folded, calibration, work_dir=tmp_path)
    symmetric, table = quantize_int8(folded, calibration, work_dir=tmp_path, symmetric=True)
    assert {entry["zero_point"] for entry in table.values()} == {0}
    batched = batch_over_images(portable, row_shapes=ROWS)
    violations = check_tensorrt_graph(batched)
    assert violations and {v.rule for v in violations} == {"qdq-int8-symmetric"}
    assert all(v.path == "batch/over_images.body" for v in violations)
    assert check_tensorrt_graph(batch_over_images(symmetric, row_shapes=ROWS)) == []
    # The unfolded graph's If branches slice with run-time axes; folding makes them constant.
    unfolded = check_tensorrt_graph(batch_over_images(one_image_graph, row_shapes=ROWS))
    assert {v.rule for v in unfolded} == {"axes-constant"}

    path = tmp_path / "portable.int8.onnx"
    onnx.save(batched, str(path))
    argv = ["gen_trt_engine", "-m", str(path), "--data_type", "int8", "--max_batch_size", "2"]
    assert main([*argv, "-r", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "rule qdq-int8-symmetric" in err and "--target tensorrt" in err
    assert err.count("\n") == 1


def test_folding_keeps_the_outputs_and_makes_rpn_topk_k_constant(one_image_graph):
    from maskops.export.folding import fold_shape_arithmetic

    folded = fold_shape_arithmetic(one_image_graph)
    assert len(folded.graph.node) < len(one_image_graph.graph.node)
    producers = {out: node for node in folded.graph.node for out in node.output}
    rpn_k = [
        producers[node.input[1]].op_type
        for node in folded.graph.node
        if node.op_type == "TopK" and node.name.startswith("/model/rpn/")
    ]
    assert rpn_k and set(rpn_k) == {"Constant"}
    images = _images(2)
    before, after = _session(one_image_graph), _session(folded)
    for i in range(2):
        image = {"images": images[i : i + 1]}
        for want, got in zip(before.run(None, image), after.run(None, image), strict=True):
            np.testing.assert_array_equal(got, want)
