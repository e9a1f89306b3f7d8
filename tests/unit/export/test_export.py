"""Export parity: fp32, fp16 and int8 ONNX against the PyTorch model on demo data."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr
from pathlib import Path

import onnx
import pytest
import torch

from maskops.checkpoints.model_file import load_model
from maskops.export import (
    ExportError,
    ExportResult,
    OnnxPredictor,
    Tolerances,
    compare_detections,
    export_onnx,
    read_metadata,
)
from maskops.export.batching import image_graph
from maskops.export.exporter import read_image_dir, training_calibration_images
from maskops.export.graph import graph_batch_size
from maskops.export.precision import CALIBRATION_CACHE_FORMAT
from maskops.export.tensorrt import BatchProfile, build_engine, tensorrt_available
from maskops.export.tensorrt_rules import check_tensorrt_graph
from maskops.spec.models import ExperimentSpec
from tests.support.gpu import needs_tensorrt


@pytest.fixture(scope="module")
def fp32_export(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path, tiny_spec: ExperimentSpec
):
    out = tmp_path_factory.mktemp("export") / "model.onnx"
    return export_onnx(
        tiny_checkpoint,
        tiny_spec,
        out,
        data_type="fp32",
        engine_file=out.with_suffix(".plan"),
        output_layout="maskops",  # an engine request alone would choose TAO's layout
        log=lambda _: None,
    )


def test_fp32_export_matches_pytorch_and_names_its_tensors(fp32_export, tiny_checkpoint):
    result = fp32_export
    assert result.parity.passed, result.parity.summary()
    assert result.parity.reference_detections > 0
    assert result.parity.matched == result.parity.reference_detections
    names = [o["name"] for o in result.io["outputs"]]
    assert [i["name"] for i in result.io["inputs"]] == ["images"]
    assert names == ["boxes", "scores", "labels", "masks", "num_detections"]
    meta = read_metadata(result.onnx_path)
    loaded = load_model(tiny_checkpoint)
    assert meta.label_map == loaded.label_map
    assert meta.image_size == (128, 128)
    assert meta.batch_size is None and result.io["inputs"][0]["shape"] == ["batch", 3, 128, 128]
    assert meta.output_layout == "maskops"
    report = json.loads(result.report_path.read_text())
    assert report["parity"]["passed"] is True
    assert report["tensorrt_profile"] == {"min": 1, "opt": 16, "max": 16}
    assert report["output_layout"] == "maskops"


def test_an_export_with_an_engine_is_checked_for_tensorrt(fp32_export):
    """--engine_file makes the graph TensorRT-bound: it passes TensorRT's import rules
    (constant Loop condition, static rows, RPN TopK K folded to constants)."""
    assert fp32_export.target == "tensorrt"
    assert fp32_export.tensorrt_plugins == ["ROIAlign_TRT"]
    model = onnx.load(str(fp32_export.onnx_path))
    assert check_tensorrt_graph(model) == []
    outputs = {o["name"]: o["shape"] for o in fp32_export.io["outputs"]}
    assert outputs["masks"] == ["batch", 20, 16, 16] and outputs["boxes"] == ["batch", 20, 4]
    report = json.loads(fp32_export.report_path.read_text())
    assert report["target"] == "tensorrt" and report["tensorrt_plugins"] == ["ROIAlign_TRT"]


def test_onnx_predictor_has_the_eager_call_shape(fp32_export, tiny_checkpoint):
    loaded = load_model(tiny_checkpoint)
    predictor = OnnxPredictor(fp32_export.onnx_path)
    images = [torch.rand(3, 128, 128, generator=torch.Generator().manual_seed(i)) for i in (1, 2)]
    got = predictor(images)
    with torch.inference_mode():
        want = loaded.model(images)
    for g, w in zip(got, want, strict=True):
        assert set(g) == {"boxes", "scores", "labels", "masks"}
        assert g["boxes"].shape == w["boxes"].shape
        assert g["masks"].shape == w["masks"].shape
        assert g["labels"].dtype == torch.int64
        torch.testing.assert_close(g["scores"], w["scores"], atol=2e-3, rtol=0)
    with pytest.raises(ValueError, match="resize_and_pad"):
        predictor([torch.rand(3, 64, 64)])


def test_predictors_answer_uint8_pixels_as_the_same_pixels_divided_by_255(
    fp32_export, tiny_checkpoint
):
    """What evaluation and inference now hand over (``keep_uint8``): the same detections,
    to the bit, as the float images the host divided."""
    from maskops.evaluation.predictor import load_predictor

    generator = torch.Generator().manual_seed(7)
    pixels = [torch.randint(0, 256, (3, 128, 128), dtype=torch.uint8, generator=generator)]
    pixels.append(pixels[0].flip(-1))
    floats = [image.float().div_(255.0) for image in pixels]
    for predictor in (
        OnnxPredictor(fp32_export.onnx_path),
        load_predictor(tiny_checkpoint).predictor,
    ):
        wanted = predictor(floats)
        assert sum(len(want["scores"]) for want in wanted) > 0
        for got, want in zip(predictor(pixels), wanted, strict=True):
            assert got.keys() == want.keys()
            assert all(torch.equal(got[key], want[key]) for key in got), type(predictor)


def test_evaluate_accepts_the_onnx_file(fp32_export, tiny_spec, tiny_checkpoint):
    from maskops.evaluation import run_evaluation

    onnx_metrics = run_evaluation(
        tiny_spec, fp32_export.onnx_path, progress=False, log=lambda _: None
    )
    torch_metrics = run_evaluation(tiny_spec, tiny_checkpoint, progress=False, log=lambda _: None)
    assert set(onnx_metrics) == set(torch_metrics)
    for key in ("AP", "mask_AP", "ARmax100"):
        assert onnx_metrics[key] == pytest.approx(torch_metrics[key], abs=0.01)


def test_fp16_export(tmp_path, tiny_checkpoint, tiny_spec, fp32_export):
    result = export_onnx(
        tiny_checkpoint,
        tiny_spec,
        tmp_path / "m16.onnx",
        data_type="fp16",
        target="tensorrt",
        log=lambda _: None,
    )
    assert result.parity.passed, result.parity.summary()
    assert check_tensorrt_graph(onnx.load(str(result.onnx_path))) == []
    assert result.parity.max_score > 0  # really half precision: not bit-identical to fp32
    graph = image_graph(onnx.load(str(result.onnx_path)))
    conv_weights = {n.input[1] for n in graph.node if n.op_type == "Conv"}
    assert conv_weights
    dtypes = {i.data_type for i in graph.initializer if i.name in conv_weights}
    assert dtypes == {onnx.TensorProto.FLOAT16}
    assert result.onnx_path.stat().st_size < 0.6 * fp32_export.onnx_path.stat().st_size


def test_int8_export_reports_a_bounded_mask_ap_drop(tmp_path, trained_model):
    """On a model that detects (the trained fixture): INT8 loses at most 0.03 mask AP.

    bench/bench_precision.py measures the drop on the demo recipe's full run: 0.8 points.
    """
    cache = tmp_path / "cal.json"
    result = export_onnx(
        trained_model.checkpoint,
        trained_model.spec,
        tmp_path / "m8.onnx",
        data_type="int8",
        cal_image_dir=trained_model.dataset.train_images,
        batches=2,
        batch_size=4,
        cal_cache_file=cache,
        log=lambda _: None,
    )
    assert result.parity.passed, result.parity.summary()
    ops = {n.op_type for n in image_graph(onnx.load(str(result.onnx_path))).node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    table = json.loads(cache.read_text())
    assert table["format"] == CALIBRATION_CACHE_FORMAT and table["num_images"] == 8
    assert all(v["scale"] > 0 for v in table["tensors"].values())
    fp32_ap = result.metrics["fp32"]["mask_AP"]
    assert fp32_ap == pytest.approx(trained_model.mask_ap, abs=0.02)
    drop = result.mask_ap_drop
    assert drop is not None
    assert drop <= 0.03, result.metrics


@pytest.fixture(scope="module")
def tensorrt_int8_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint, tiny_spec
) -> tuple[ExportResult, list[str], str]:
    """The export, its log lines and its progress off a terminal (stderr a file)."""
    out = tmp_path_factory.mktemp("trt_int8") / "m8.onnx"
    lines: list[str] = []
    stderr = io.StringIO()
    with redirect_stderr(stderr):
        result = export_onnx(
            tiny_checkpoint,
            tiny_spec,
            out,
            data_type="int8",
            target="tensorrt",
            batches=1,
            batch_size=2,
            evaluate_int8=False,
            log=lines.append,
            progress=True,
        )
    return result, lines, stderr.getvalue()


@pytest.fixture(scope="module")
def tensorrt_int8_export(tensorrt_int8_run: tuple[ExportResult, list[str], str]) -> ExportResult:
    return tensorrt_int8_run[0]


def test_export_off_a_terminal_reports_its_stages_in_whole_lines(
    tensorrt_int8_run: tuple[ExportResult, list[str], str],
) -> None:
    """A line as each stage starts; the counted stages' progress as whole lines."""
    _, lines, progress = tensorrt_int8_run
    assert "\r" not in progress
    assert re.search(r"^calibrate: 2/2 img \(100%\), [\d.]+ img/s", progress, re.M), progress
    assert re.search(r"^parity: 4/4 img \(100%\), [\d.]+ img/s", progress, re.M), progress
    assert "evaluate" not in progress  # evaluate_int8=False
    stages = ["Tracing ", "Calibrating int8 on 2 images", "TensorRT import rules: passed"]
    stages += ["Checking the ONNX against PyTorch on 4 validation images", "Writing ", "Exported "]
    starts = [
        next((i for i, line in enumerate(lines) if line.startswith(stage)), -1) for stage in stages
    ]
    assert -1 not in starts and starts == sorted(starts), lines


def test_tensorrt_int8_is_symmetric_int8_and_passes_parity_and_the_rules(tensorrt_int8_export):
    result = tensorrt_int8_export
    assert result.parity.passed, result.parity.summary()
    model = onnx.load(str(result.onnx_path))
    assert check_tensorrt_graph(model) == []
    graph = image_graph(model)
    weights = {init.name: init for init in graph.initializer}
    quantizers = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert quantizers
    zero_points = [weights[n.input[2]] for n in quantizers]
    assert {z.data_type for z in zero_points} == {onnx.TensorProto.INT8}
    assert all(not onnx.numpy_helper.to_array(z).any() for z in zero_points)
    table = json.loads(result.cal_cache_file.read_text())
    assert table["activation_type"] == "int8 symmetric" and table["num_images"] == 2
    assert {v["zero_point"] for v in table["tensors"].values()} == {0}


@pytest.mark.gpu
@needs_tensorrt
def test_tensorrt_int8_engine(tmp_path, tensorrt_int8_export):  # pragma: no cover - GPU only
    engine = build_engine(
        tensorrt_int8_export.onnx_path,
        tmp_path / "m8.plan",
        data_type="int8",
        image_size=(128, 128),
        profile=BatchProfile(1, 2, 4),
    )
    assert engine.stat().st_size > 0


def test_parity_check_fails_a_graph_that_disagrees():
    ref = [
        {
            "boxes": torch.tensor([[0.0, 0, 100, 100]]),
            "scores": torch.tensor([0.9]),
            "labels": torch.tensor([1]),
            "masks": torch.zeros(1, 1, 4, 4),
        }
    ]
    shifted = [{**ref[0], "boxes": ref[0]["boxes"] + 1.0}]  # IoU 0.96, 1 px off
    moved_far = [{**ref[0], "boxes": ref[0]["boxes"] + 60.0}]
    tight = compare_detections(ref, shifted, data_type="fp32")
    assert not tight.passed and "box" in tight.failures[0]
    assert not compare_detections(ref, moved_far, data_type="fp16").passed
    assert compare_detections(
        ref,
        shifted,
        data_type="fp16",
        tolerances=Tolerances(
            match_iou=0.5, box_px=3.0, score=0.1, mask_prob=0.1, min_matched_fraction=1.0
        ),
    ).passed
    wrong_label = [{**ref[0], "labels": torch.tensor([2])}]
    assert not compare_detections(ref, wrong_label, data_type="int8").passed


def test_boxes_without_area_match_only_boxes_they_agree_with() -> None:
    """Detections clipped to an image edge have no area: their IoU is 0 / 0. Such a pair
    matched any box before (NaN compared as not below the bound), pairing unrelated
    detections; it now matches where the boxes agree, and equal boxes go to the closest
    score."""
    edge = torch.tensor([[256.0, 0.0, 256.0, 250.0], [256.0, 0.0, 256.0, 120.0]])
    ref = [{"boxes": edge, "scores": torch.tensor([0.9, 0.8]), "labels": torch.tensor([1, 1])}]
    same = compare_detections(ref, ref, data_type="fp32")
    assert same.passed and same.matched == 2 and same.max_box_px == 0.0
    listed_otherwise = [{key: value.flip(0) for key, value in ref[0].items()}]
    assert compare_detections(ref, listed_otherwise, data_type="fp32").passed
    boxes_swapped = [{**ref[0], "boxes": edge.flip(0)}]
    assert not compare_detections(ref, boxes_swapped, data_type="fp32").passed
    duplicates = {"boxes": edge[:1].repeat(2, 1), "labels": torch.tensor([1, 1])}
    ref = [{**duplicates, "scores": torch.tensor([0.9, 0.5])}]
    reordered = [{**duplicates, "scores": torch.tensor([0.5, 0.9])}]
    report = compare_detections(ref, reordered, data_type="fp32")
    assert report.passed and report.max_score == 0.0


def test_export_fails_when_onnx_disagrees(tmp_path, tiny_checkpoint, tiny_spec):
    impossible = Tolerances(
        match_iou=0.95, box_px=0.0, score=0.0, mask_prob=0.0, min_matched_fraction=1.0
    )
    out = tmp_path / "bad.onnx"
    with pytest.raises(ExportError, match="does not match PyTorch"):
        export_onnx(
            tiny_checkpoint,
            tiny_spec,
            out,
            data_type="fp16",
            tolerances=impossible,
            log=lambda _: None,
        )
    assert not out.exists()


def test_static_batch_export(tmp_path, tiny_checkpoint, tiny_spec):
    """A graph of batch 3 checked on 4 validation images (a run of 3, then 1 filled); bound
    for TensorRT, it passes the import rules and has no Loop."""
    result = export_onnx(
        tiny_checkpoint,
        tiny_spec,
        tmp_path / "s.onnx",
        static_batch_size=3,
        target="tensorrt",
        log=lambda _: None,
    )
    assert result.parity.passed and result.parity.reference_detections > 0
    assert result.target == "tensorrt"
    graph = onnx.load(str(result.onnx_path))
    assert graph_batch_size(graph) == 3
    assert "Loop" not in {node.op_type for node in graph.graph.node}
    meta = read_metadata(result.onnx_path)
    assert (meta.batch_size, meta.max_batch_size) == (3, 3)
    report = json.loads(result.report_path.read_text())
    assert report["static_batch_size"] == 3
    assert report["tensorrt_profile"] == {"min": 3, "opt": 3, "max": 3}
    assert result.io["inputs"][0]["shape"] == [3, 3, 128, 128]


def test_bad_arguments_are_one_line_errors(tmp_path, tiny_checkpoint, tiny_spec):
    with pytest.raises(ExportError, match="--data_type 'int4'"):
        export_onnx(tiny_checkpoint, tiny_spec, tmp_path / "x.onnx", data_type="int4")
    with pytest.raises(ExportError, match="model file not found"):
        export_onnx(tmp_path / "missing.pth", tiny_spec, tmp_path / "x.onnx")
    with pytest.raises(ExportError, match=r"must end in \.onnx"):
        export_onnx(tiny_checkpoint, tiny_spec, tmp_path / "x.plan")
    with pytest.raises(ExportError, match="min <= opt <= max"):
        export_onnx(
            tiny_checkpoint, tiny_spec, tmp_path / "x.onnx", max_batch_size=2, min_batch_size=3
        )
    with pytest.raises(ExportError, match="--static_batch_size must be at least 1"):
        export_onnx(tiny_checkpoint, tiny_spec, tmp_path / "x.onnx", static_batch_size=0)
    with pytest.raises(ExportError, match="--target 'tensorflow'"):
        export_onnx(tiny_checkpoint, tiny_spec, tmp_path / "x.onnx", target="tensorflow")
    with pytest.raises(ExportError, match="--gpu_index must be at least 0"):
        export_onnx(tiny_checkpoint, tiny_spec, tmp_path / "x.onnx", gpu_index=-1)
    assert not list(tmp_path.glob("*.onnx"))
    with pytest.raises(ExportError, match="cal_image_dir"):
        export_onnx(
            tiny_checkpoint,
            tiny_spec,
            tmp_path / "x.onnx",
            data_type="int8",
            cal_image_dir=tmp_path / "nope",
        )


def test_engine_is_built_only_where_tensorrt_exists(fp32_export):
    engine = fp32_export.onnx_path.with_suffix(".plan")
    if tensorrt_available():
        assert fp32_export.engine_file == engine and engine.stat().st_size > 0
    else:
        assert fp32_export.engine_file is None and not engine.exists()
        assert "not built here" in fp32_export.engine_note
        assert "GPU host" in fp32_export.engine_note


@pytest.mark.gpu
@needs_tensorrt
def test_tensorrt_fp16_engine(tmp_path, fp32_export):
    engine = build_engine(
        fp32_export.onnx_path,
        tmp_path / "m.plan",
        data_type="fp16",
        image_size=(128, 128),
        profile=BatchProfile(1, 2, 4),
    )
    assert engine.stat().st_size > 0


def test_calibration_sources(tiny_spec, tiny_checkpoint, demo_dataset, tmp_path):
    label_map = load_model(tiny_checkpoint).label_map
    shards = training_calibration_images(tiny_spec, label_map, batches=2, batch_size=3)
    assert len(shards) == 6
    assert all(t.shape == (3, 128, 128) and t.dtype == torch.float32 for t in shards)
    folder = read_image_dir(demo_dataset.train_images, (128, 128), limit=5)
    assert len(folder) == 5 and all(0.0 <= float(t.min()) <= float(t.max()) <= 1.0 for t in folder)
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(ExportError, match="no JPEG/PNG"):
        read_image_dir(tmp_path, (128, 128), limit=5)


def test_export_cli_bad_input_is_one_line(tmp_path, tiny_spec, capsys):
    from maskops.cli.main import main as cli_main
    from maskops.spec import spec_to_text

    spec_file = tmp_path / "spec.txt"
    spec_file.write_text(spec_to_text(tiny_spec))
    code = cli_main(["export", "-m", str(tmp_path / "none.pth"), "-e", str(spec_file)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model file not found" in err[0]
