"""``maskops gen_trt_engine``: tao-deploy's mask_rcnn flags parse, the checks that need no GPU
run first, and without TensorRT or a GPU the command fails in one line, exit 1."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from maskops.cli.gen_trt_engine import engine_path
from maskops.cli.main import build_parser, main
from maskops.export.tensorrt import tensorrt_unavailable_reason
from maskops.spec.models import DataConfig, ExperimentSpec
from maskops.spec.text import spec_to_text
from tests.support.gpu import needs_tensorrt

NO_TENSORRT = tensorrt_unavailable_reason()


def _onnx(
    path: Path, *, input_name: str = "images", qdq: bool = False, batch: int | str = 1
) -> Path:
    """A minimal graph with maskops' input ``images`` [batch, 3, 128, 192] (QDQ if asked)."""
    x = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, 3, 128, 192])
    y = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [batch, 3, 128, 192])
    if qdq:
        scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [0.1])
        zero = helper.make_tensor("zero", TensorProto.INT8, [], [0])
        nodes = [
            helper.make_node("QuantizeLinear", [input_name, "scale", "zero"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["boxes"]),
        ]
        graph = helper.make_graph(nodes, "g", [x], [y], initializer=[scale, zero])
    else:
        graph = helper.make_graph(
            [helper.make_node("Identity", [input_name], ["boxes"])], "g", [x], [y]
        )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_parser_takes_tao_deploys_flags(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "gen_trt_engine",
            "-m", "model.int8.onnx",
            "-e", "spec.txt",
            "-k", "nvidia_tlt",
            "--engine_file", "out/model.engine",
            "--data_type", "int8",
            "--batch_size", "8",
            "--batches", "4",
            "--max_batch_size", "4",
            "--min_batch_size", "2",
            "--opt_batch_size", "3",
            "--cal_image_dir", "images",
            "--cal_data_file", "cal.tensorfile",
            "--cal_cache_file", "cal.bin",
            "--max_workspace_size", "3",
            "-s",
            "-v",
            "-r", "results",
        ]
    )  # fmt: skip
    assert args.command == "gen_trt_engine"
    assert (args.model_path, args.experiment_spec) == (Path("model.int8.onnx"), Path("spec.txt"))
    assert (args.engine_file, args.results_dir) == (Path("out/model.engine"), Path("results"))
    assert (args.data_type, args.batch_size, args.batches) == ("int8", 8, 4)
    assert (args.max_batch_size, args.min_batch_size, args.opt_batch_size) == (4, 2, 3)
    assert (args.cal_image_dir, args.cal_data_file, args.cal_cache_file) == (
        "images",
        "cal.tensorfile",
        "cal.bin",
    )
    assert args.max_workspace_size == 3 and args.strict_type_constraints and args.verbose
    assert args.key == "nvidia_tlt"
    assert engine_path(args) == Path("out/model.engine")

    defaults = build_parser().parse_args(
        ["gen_trt_engine", "--model_path", "m/model.fp16.onnx", "--results_dir", "r"]
    )
    assert (defaults.data_type, defaults.max_workspace_size, defaults.max_batch_size) == (
        "fp32",
        2,
        None,
    )
    defaults.data_type = "fp16"
    assert engine_path(defaults) == Path("r/model.fp16.engine")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["gen_trt_engine", "-m", "model.onnx"])  # -r is required


@pytest.mark.skipif(NO_TENSORRT is None, reason="TensorRT and a GPU are here")
def test_without_tensorrt_it_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _onnx(tmp_path / "model.fp32.onnx")
    code = main(["gen_trt_engine", "-m", str(model), "-r", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 1
    assert err == f"maskops gen_trt_engine: error: no TensorRT engine built: {NO_TENSORRT}\n"
    assert not list(tmp_path.glob("r/*.engine"))


def test_bad_input_is_reported_before_any_gpu_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = _onnx(tmp_path / "model.onnx")
    spec = tmp_path / "spec.txt"
    spec.write_text(spec_to_text(ExperimentSpec(data_config=DataConfig(image_size=(128, 128)))))
    foreign = _onnx(tmp_path / "foreign.onnx", input_name="input_1")
    (tmp_path / "model.etlt").write_bytes(b"encrypted")
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf")
    cases = [
        (["-m", str(tmp_path / "missing.onnx")], "no such file"),
        (["-m", str(tmp_path / "model.etlt")], "encrypted .etlt models are not read"),
        (["-m", str(tmp_path / "junk.onnx")], "not a readable ONNX model"),
        (["-m", str(foreign)], "no input 'images' or 'Input' [N, 3, H, W]"),
        (["-m", str(plain), "--data_type", "int8"], "needs the QDQ ONNX"),
        (["-m", str(plain), "-e", str(spec)], "image_size [128, 128] differs from the ONNX"),
        (["-m", str(plain), "--gpu_index", "-1"], "--gpu_index must be at least 0"),
    ]
    for flags, message in cases:
        assert main(["gen_trt_engine", *flags, "-r", str(tmp_path / "r")]) == 2, flags
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (flags, err)

    qdq = _onnx(tmp_path / "model.int8.onnx", qdq=True)
    code = main(["gen_trt_engine", "-m", str(qdq), "--data_type", "int8", "-r", str(tmp_path)])
    if NO_TENSORRT:  # the QDQ graph passes every check; only the GPU is missing
        assert code == 1 and "no TensorRT engine built" in capsys.readouterr().err


def test_flags_that_change_nothing_say_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _onnx(tmp_path / "model.onnx")
    argv = ["gen_trt_engine", "-m", str(model), "-r", str(tmp_path)]
    main([*argv, "--cal_cache_file", "cal.bin"])
    err = capsys.readouterr().err
    assert "maskops: note: --cal_cache_file is ignored: a maskops int8 engine" in err
    main(["gen_trt_engine", "-m", str(model), "-r", str(tmp_path)])
    assert "note:" not in capsys.readouterr().err


def test_batch_flags_shape_the_profile_or_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dynamic-batch ONNX takes the flags' profile (checked min <= opt <= max); a
    static-batch one refuses a batch flag that contradicts it. Both before any GPU work."""
    static = _onnx(tmp_path / "static.onnx", batch=1)
    dynamic = _onnx(tmp_path / "dynamic.onnx", batch="batch")
    refused = [
        (
            [str(static), "--max_batch_size", "8"],
            "--max_batch_size 8: the ONNX has a static batch of 1",
        ),
        ([str(dynamic), "--min_batch_size", "3", "--max_batch_size", "2"], "min <= opt <= max"),
        ([str(dynamic), "--min_batch_size", "0", "--max_batch_size", "2"], "at least 1"),
        ([str(dynamic), "--max_batch_size", "0"], "min <= opt <= max"),
        ([str(dynamic)], "not a maskops ONNX export"),  # no --max_batch_size, no metadata
    ]
    for model_and_flags, message in refused:
        argv = ["gen_trt_engine", "-m", *model_and_flags, "-r", str(tmp_path / "r")]
        assert main(argv) == 2, model_and_flags
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (model_and_flags, err)
    code = main(
        ["gen_trt_engine", "-m", str(dynamic), "--max_batch_size", "4", "-r", str(tmp_path)]
    )
    if NO_TENSORRT:
        assert code == 1 and "no TensorRT engine built" in capsys.readouterr().err


@pytest.mark.gpu
@needs_tensorrt
def test_the_engine_comes_with_the_record_publish_checks(tmp_path: Path, capsys) -> None:
    """Where TensorRT and a GPU exist: the engine's record names this TensorRT, and publish
    serves the engine in a Triton of that version only."""
    import tensorrt

    from maskops.serving import EnsembleNames, PublishError, publish
    from maskops.serving.engines import read_engine_record
    from maskops.serving.placement import Placement
    from tests.support.fake_export import fake_onnx_export

    onnx_path = fake_onnx_export(tmp_path / "m.fp16.onnx", "batch")
    assert (
        main(["gen_trt_engine", "-m", str(onnx_path), "-r", str(tmp_path), "--data_type", "fp16"])
        == 0
    )
    engine = tmp_path / "m.fp16.engine"
    record = read_engine_record(engine)
    assert record.tensorrt_version == tensorrt.__version__
    assert record.profile == {"min": 1, "opt": 3, "max": 3} and record.data_type == "fp16"
    repo = tmp_path / "repo"
    gpu = Placement("gpu")
    publish(onnx_path, repo, "m", net_backend="tensorrt", placement=gpu,
            triton_tensorrt_version=tensorrt.__version__)  # fmt: skip
    assert (repo / EnsembleNames("m").net / "1" / "model.plan").read_bytes() == engine.read_bytes()
    with pytest.raises(PublishError, match="loads only in the version that built it"):
        publish(onnx_path, repo, "m", net_backend="tensorrt", placement=gpu,
                triton_tensorrt_version="9.0.0.0")  # fmt: skip
