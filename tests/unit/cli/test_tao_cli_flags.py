"""TAO 5.3 flags of dataset_convert, train, evaluate, inference, prune and export: each one,
fed through the real parser, either changes what the command does or prints why it changes
nothing here."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from maskops.cli import dataset_convert, evaluate, export, inference, prune, train
from maskops.cli.common import CLIError, load_resolved_spec
from maskops.cli.main import build_parser, main
from maskops.data.labels import LabelMap
from maskops.evaluation.inference import category_names, read_class_map
from maskops.export.tensorrt import tensorrt_unavailable_reason
from maskops.prune.report import GroupDecision, LayerChannels, PruneReport
from maskops.spec.models import ExperimentSpec

if TYPE_CHECKING:
    from maskops.data.demo import DemoDataset

Check = Callable[[argparse.Namespace], object]
"""Runs the command's flag handling; returns what the flag should change."""

SPEC = 'data_config {\n  val_json_file: "val.json"\n  validation_file_pattern: "%s"\n}\n'
LABELS = LabelMap.from_coco_categories(
    [{"id": 1, "name": "circle"}, {"id": 3, "name": "square"}, {"id": 7, "name": "triangle"}]
)


def _spec(directory: Path, *, shards: bool) -> Path:
    path = directory / ("with_shards.txt" if shards else "no_shards.txt")
    path.write_text(SPEC % ("val-*" if shards else ""))
    return path


def _names(args: argparse.Namespace) -> object:
    class_map = read_class_map(args.class_map) if args.class_map else None
    return category_names(LABELS, class_map)


def _option(key: str, default: object = None) -> Check:
    """The export_onnx keyword argument ``key`` the flags map to."""
    return lambda args: export.builder_options(args).get(key, default)


def _spec_of(args: argparse.Namespace) -> ExperimentSpec:
    return load_resolved_spec(args.experiment_spec)


PRUNED = PruneReport(
    norm="max",
    equalization="union",
    granularity=8,
    threshold=0.1,
    min_filters=16,
    excluded_layers=[],
    image_size=(128, 128),
    params_before=100,
    params_after=80,
    macs_before=10,
    macs_after=8,
    layers=[LayerChannels("backbone.body.conv1", 3, 64, 3, 48)],
    groups=[
        GroupDecision(("backbone.body.conv1",), 64, 48, "pruned"),
        GroupDecision(("rpn.head.conv",), 256, 256, "fixed"),
    ],
)


def _prune_output(args: argparse.Namespace) -> object:
    return prune.report_text(args, PRUNED).splitlines()


EXPORT = "export -m m.pth -e {spec}"
INFER = "inference -i {tmp}/in -e {spec} -m {tmp}/m.pth -o {tmp}/out"
NOTE = "maskops: note: "
EXPORT_DEFAULTS = {"strict_types": False, "target": "onnxruntime", "gpu_index": 0}
NO_ENGINE = tensorrt_unavailable_reason() and "changes nothing: no TensorRT engine is built here"
"""Where TensorRT is missing, the builder flags explain that they change nothing."""

# (command line, the flag(s) under test, what reads them, result without / with the flag,
#  the notice expected when given, or None). {spec}, {nospec}, {tmp} are filled per test.
ROWS: list[tuple[str, str, Check, object, object, str | None]] = [
    (
        "dataset_convert -i {tmp}/images -a {tmp}/a.json -o {tmp}/out",
        "-r {tmp}/res",
        dataset_convert.log_file,
        None,
        "{tmp}/res/dataset_convert.log",
        None,
    ),
    (
        "prune -m {tmp}/m.pth -o {tmp}/out",
        "-v",
        _prune_output,
        PRUNED.format_table().splitlines(),
        [
            *PRUNED.format_table().splitlines(),
            "",
            "coupled groups (convs whose outputs keep the same channels):",
            "pruned      64 -> 48    backbone.body.conv1",
            "fixed      256 -> 256   rpn.head.conv",
        ],
        None,
    ),
    (
        "train -e {spec} -d {tmp}/r",
        "--use_amp",
        lambda a: train.training_spec(a).use_amp,
        False,
        True,
        None,
    ),
    (
        "evaluate -e {spec} -m {tmp}/m.pth",
        "-r {tmp}/res",
        evaluate.outputs,
        ("{tmp}/m.eval.json", None),
        ("{tmp}/res/evaluation.json", "{tmp}/res/evaluate.log"),
        None,
    ),
    (
        "evaluate -e {nospec} -m {tmp}/m.pth",
        "-i {tmp}/images",
        lambda a: evaluate.image_dir(a, _spec_of(a)),
        None,
        "{tmp}/images",
        None,
    ),
    (
        "evaluate -e {spec} -m {tmp}/m.pth",
        "-i {tmp}/images",
        lambda a: evaluate.image_dir(a, _spec_of(a)),
        None,
        None,
        "-i/--image_dir is ignored: the validation shards",
    ),
    (
        INFER,
        "-r {tmp}/res",
        inference.output_dirs,
        ("{tmp}/out", None),
        ("{tmp}/out", "{tmp}/res/labels"),
        None,
    ),
    (
        INFER,
        "-c {tmp}/labels.txt",
        _names,
        {1: "circle", 3: "square", 7: "triangle"},
        {1: "round", 3: "square", 7: "tri"},
        None,
    ),
    (EXPORT, "--target_opset 13", _option("opset", 17), 17, 13, None),
    (
        EXPORT,
        "--engine_file e.engine --max_workspace_size 1024",
        _option("workspace_bytes"),
        None,
        1024,
        NO_ENGINE and f"--max_workspace_size {NO_ENGINE}",
    ),
    (
        EXPORT,
        "--engine_file e.engine -s",
        _option("strict_types"),
        False,
        True,
        NO_ENGINE and f"-s {NO_ENGINE}",
    ),
    (
        EXPORT,
        "--max_workspace_size 1024 -s",
        _option("strict_types"),
        False,
        True,
        "--max_workspace_size/-s changes nothing without --engine_file",
    ),
    (
        EXPORT,
        "--force_ptq",
        export.builder_options,
        EXPORT_DEFAULTS,
        EXPORT_DEFAULTS,
        "--force_ptq is implied",
    ),
    (
        EXPORT,
        "--cal_json_file s.json",
        export.builder_options,
        EXPORT_DEFAULTS,
        EXPORT_DEFAULTS,
        "--cal_json_file is ignored",
    ),
    (
        EXPORT,
        "--cal_data_file c.tensorfile",
        export.builder_options,
        EXPORT_DEFAULTS,
        EXPORT_DEFAULTS,
        "--cal_data_file is ignored",
    ),
    (
        EXPORT,
        "--onnx_route tf2onnx",
        export.builder_options,
        EXPORT_DEFAULTS,
        EXPORT_DEFAULTS,
        "--onnx_route is ignored",
    ),
    (
        EXPORT,
        "--static_batch_size 4",
        _option("static_batch_size"),
        None,
        4,
        None,
    ),
    (
        EXPORT,
        "--engine_file e.engine --min_batch_size 2",
        _option("min_batch_size"),
        None,
        2,
        NO_ENGINE and f"--min_batch_size {NO_ENGINE}",
    ),
    (
        EXPORT,
        "--engine_file e.engine --opt_batch_size 2",
        _option("opt_batch_size"),
        None,
        2,
        NO_ENGINE and f"--opt_batch_size {NO_ENGINE}",
    ),
    (
        EXPORT,
        "--opt_batch_size 2",
        _option("opt_batch_size"),
        None,
        2,
        "--opt_batch_size changes nothing without --engine_file",
    ),
    (
        EXPORT,
        "--target tensorrt",
        lambda a: export.builder_options(a)["target"] == "tensorrt",
        False,
        True,
        None,
    ),
    (
        EXPORT,
        "--gpu_index 1",
        _option("gpu_index"),
        0,
        1,
        "--gpu_index changes nothing without --engine_file",
    ),
]


def _fill(value: object, tmp: Path) -> object:
    """A row's expected value with {tmp} filled in; strings naming files become Paths."""
    if isinstance(value, str):
        return Path(value.format(tmp=tmp))
    if isinstance(value, tuple):
        return tuple(_fill(v, tmp) for v in value)
    return value


@pytest.mark.parametrize(
    ("line", "flags", "check", "without", "with_flag", "note"),
    ROWS,
    ids=[f"{r[0].split()[0]} {r[1]}" for r in ROWS],
)
def test_flag_changes_behaviour_or_explains_why_not(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    line: str,
    flags: str,
    check: Check,
    without: object,
    with_flag: object,
    note: str | None,
) -> None:
    (tmp_path / "labels.txt").write_text("round\n\ntri\n")
    paths = {
        "spec": _spec(tmp_path, shards=True),
        "nospec": _spec(tmp_path, shards=False),
        "tmp": tmp_path,
    }
    base = line.format(**paths).split()
    parser = build_parser()

    plain = check(parser.parse_args(base))
    assert NOTE not in capsys.readouterr().err
    given = check(parser.parse_args(base + flags.format(**paths).split()))
    err = capsys.readouterr().err

    assert plain == _fill(without, tmp_path)
    assert given == _fill(with_flag, tmp_path)
    if note is None:
        assert NOTE not in err
    else:
        assert err.startswith(NOTE + note) and err.count("\n") == 1


def test_inference_needs_an_output_directory(tmp_path: Path) -> None:
    args = build_parser().parse_args(["inference", "-i", "in", "-e", "s.txt", "-m", "m.pth"])
    with pytest.raises(CLIError, match="-o/--out_image_dir or -r/--results_dir"):
        inference.output_dirs(args)
    args.results_dir = tmp_path
    assert inference.output_dirs(args) == (tmp_path / "images_annotated", tmp_path / "labels")


def test_target_opset_is_the_exported_graphs_opset(
    tmp_path: Path, tiny_spec: ExperimentSpec, tiny_checkpoint: Path
) -> None:
    import onnx

    from maskops.spec import spec_to_text

    spec = tmp_path / "spec.txt"
    spec.write_text(spec_to_text(tiny_spec))
    out = tmp_path / "model.onnx"
    args = ["export", "-m", str(tiny_checkpoint), "-e", str(spec), "-o", str(out)]
    # The parity check against PyTorch runs on the opset-13 graph, and passes.
    assert main([*args, "--target_opset", "13"]) == 0
    opsets = {o.domain: o.version for o in onnx.load(str(out)).opset_import}
    assert opsets[""] == 13
    assert main([*args, "--target_opset", "12", "--data_type", "int8"]) == 2
    assert main([*args, "--target_opset", "99"]) == 2


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["train", "--experiment_spec_file", "s.txt", "-d", "r"], "experiment_spec", "s.txt"),
        (["train", "-e", "s.txt", "--model_dir", "r"], "results_dir", "r"),
        (["evaluate", "-e", "s.txt", "--model_path", "m.pth"], "model", "m.pth"),
        (["inference", "-i", "d", "-e", "s", "--model_path", "m.pth", "-r", "o"], "model", "m.pth"),
    ],
)
def test_tao_long_option_names_are_aliases(argv: list[str], dest: str, value: str) -> None:
    """TAO 5.3's docs spell these flags both ways; either reaches the same option."""
    from maskops.cli.main import build_parser

    assert str(getattr(build_parser().parse_args(argv), dest)) == value


def test_dataset_convert_results_dir_keeps_the_summary(
    tmp_path: Path, demo_dataset: DemoDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["dataset_convert", "-i", str(demo_dataset.val_images), "-a", str(demo_dataset.val_json)]
    results = tmp_path / "results"
    assert main([*args, "-o", str(tmp_path / "out"), "-r", str(results), "--workers", "1"]) == 0
    summary = (results / "dataset_convert.log").read_text()
    assert summary.startswith("wrote 1 shard(s) val-") and "8 written" in summary
    assert summary == capsys.readouterr().out  # what it printed


@pytest.mark.parametrize(
    ("flags", "gpus", "gpu_index"),
    [
        ("--gpus 2 --gpu_index 0 1", 2, 0),
        ("--gpus 2 --gpu_index 2 1", 2, 1),
        ("--gpu_index 3", 1, 3),
        ("--gpus 4 --gpu_index 1", 4, 1),
        ("", 1, 0),
    ],
)
def test_train_gpu_index_takes_tao_launcher_s_list(flags: str, gpus: int, gpu_index: int) -> None:
    # TAO 5.3's launcher (nvidia_tao_tf1/cv/common/entrypoint/entrypoint.py) reads
    # `--gpu_index` with nargs="+": one index per GPU of `--gpus`.
    args = build_parser().parse_args(["train", "-e", "s.txt", "-d", "r", *flags.split()])
    options = train.train_options(args)
    assert (options.gpus, options.gpu_index) == (gpus, gpu_index)


@pytest.mark.parametrize(
    ("indices", "gpus", "visible", "selection"),
    [
        ([1, 2], 2, None, (1, None)),
        ([1, 3], 2, None, (0, "1,3")),
        ([3, 0, 1], 3, None, (0, "0,1,3")),
        ([0, 2], 2, "4,5,6", (0, "4,6")),
        ([5], 1, "4,5,6", (5, None)),
    ],
)
def test_gpu_index_list_selects_the_visible_devices(
    indices: list[int], gpus: int, visible: str | None, selection: tuple[int, str | None]
) -> None:
    assert train.gpu_selection(indices, gpus, visible) == selection


@pytest.mark.parametrize(
    ("indices", "gpus", "visible", "message"),
    [
        ([0, 1], 1, None, "--gpu_index 0 1 names 2 GPU(s) but --gpus is 1"),
        ([1, 1], 2, None, "--gpu_index 1 1 names 1 GPU(s) but --gpus is 2"),
        ([0, 3], 2, "4,5", "--gpu_index 0 3: CUDA_VISIBLE_DEVICES=4,5 makes only 2 GPU(s)"),
        ([-1, 0], 2, None, "--gpu_index -1 0: indices must be >= 0"),
    ],
)
def test_gpu_index_list_that_cannot_run_names_the_flags(
    indices: list[int], gpus: int, visible: str | None, message: str
) -> None:
    with pytest.raises(CLIError, match=re.escape(message)):
        train.gpu_selection(indices, gpus, visible)
