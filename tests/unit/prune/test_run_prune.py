"""run_prune and ``maskops prune`` end to end: checkpoint in, pruned checkpoint + report out,
then retraining from pruned_model_path and evaluation of the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from maskops.checkpoints.model_file import load_model, save_checkpoint
from maskops.cli.main import main
from maskops.data.demo import DemoDataset
from maskops.data.manifest import load_label_map
from maskops.export.batching import image_graph
from maskops.prune import PruneError, prune_model
from maskops.prune.run import REPORT_FILENAME, run_prune, trace_input
from maskops.spec.models import MaskRCNNConfig
from tests.unit.prune.small import IMAGE_SIZE, make_model, make_spec


@pytest.fixture(scope="module")
def source_checkpoint(tmp_path_factory: pytest.TempPathFactory, demo_shards: Path) -> Path:
    """A random resnet10 saved as a maskops checkpoint with the demo label map."""
    path = tmp_path_factory.mktemp("prune_source") / "model.pth"
    save_checkpoint(
        path,
        model=make_model(),
        spec=make_spec(),
        label_map=load_label_map(f"{demo_shards}/train*"),
        step=7,
    )
    return path


def test_run_prune_writes_a_loadable_pruned_checkpoint_and_a_report(
    source_checkpoint: Path, tmp_path: Path
) -> None:
    options = {"threshold": 1.0, "granularity": 8, "min_filters": 8}
    report = run_prune(source_checkpoint, tmp_path / "out", **options)  # type: ignore[arg-type]

    saved = json.loads((tmp_path / "out" / REPORT_FILENAME).read_text())
    assert saved["params_after"] == report.params_after < saved["params_before"]
    assert saved["macs_after"] < saved["macs_before"]
    assert saved["image_size"] == list(IMAGE_SIZE)
    conv1 = next(x for x in saved["layers"] if x["name"] == "backbone.body.conv1")
    assert (conv1["out_before"], conv1["out_after"]) == (64, 8)

    loaded = load_model(tmp_path / "out" / "model.pth")
    assert loaded.step == 0
    assert sum(p.numel() for p in loaded.model.parameters()) == report.params_after

    # Same weights as pruning the source in memory.
    expected = load_model(source_checkpoint).model
    prune_model(expected, example_inputs=torch.zeros(1, 3, *IMAGE_SIZE), **options)  # type: ignore[arg-type]
    got = loaded.model.state_dict()
    for key, value in expected.state_dict().items():
        assert torch.equal(got[key], value), key
    image = [torch.rand(3, *IMAGE_SIZE, generator=torch.Generator().manual_seed(5))]
    with torch.no_grad():
        out_loaded, out_expected = loaded.model(image)[0], expected.eval()(image)[0]
    assert torch.equal(out_loaded["boxes"], out_expected["boxes"])


def test_run_prune_rejects_a_file_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pth"
    bogus.write_text("not a checkpoint")
    with pytest.raises(PruneError, match=r"bogus\.pth"):
        run_prune(bogus, tmp_path / "out")


def test_pruned_model_retrains_from_pruned_model_path_and_evaluates(
    source_checkpoint: Path, tmp_path: Path, demo_shards: Path, demo_dataset: DemoDataset
) -> None:
    from maskops.evaluation.runner import run_evaluation
    from maskops.training.train import run_training

    run_prune(source_checkpoint, tmp_path / "pruned", threshold=1.0)
    spec = make_spec(demo_shards, demo_dataset.val_json).model_copy(
        update={"pruned_model_path": str(tmp_path / "pruned" / "model.pth"), "total_steps": 2}
    )
    result = run_training(spec, tmp_path / "retrain")
    assert result.step == 2 and result.checkpoint is not None
    retrained = load_model(result.checkpoint).model
    assert retrained.get_submodule("backbone.body.layer4.0.conv1").out_channels == 16
    assert retrained.get_submodule("roi_heads.box_head.fc6").in_features == 16 * 7 * 7

    metrics = run_evaluation(spec, result.checkpoint, progress=False, log=lambda _line: None)
    assert {"AP", "mask_AP"} <= metrics.keys()
    assert all(0.0 <= v <= 1.0 or v == -1.0 for v in metrics.values())


def test_cli_prune_accepts_tao_flags_and_a_model_file_as_output(
    source_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "results" / "model_pruned.tlt"
    code = main(
        [
            "prune",
            "-m",
            str(source_checkpoint),
            "-o",
            str(target),
            "-n",
            "L2",
            "-eq",
            "intersection",
            "-pg",
            "16",
            "-pth",
            "0.3",
            "-nf",
            "32",
            "-el",
            "backbone.body.layer4,rpn.head.conv",
            "-k",
            "nvidia_tlt",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "parameters:" in out and "backbone.body.conv1" in out
    assert (target.parent / REPORT_FILENAME).is_file()
    model = load_model(target).model
    # L2 scores of 512 filters (~0.044) are under 0.3, but layer4 is excluded.
    assert model.get_submodule("backbone.body.layer4.0.conv1").out_channels == 512
    assert model.get_submodule("backbone.body.layer3.0.conv1").out_channels == 32
    assert model.get_submodule("rpn.head.conv.0.0").out_channels == 256


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "L3"], "norm must be one of max, L2"),
        (["-el", "backbone.head"], "excluded layer 'backbone.head'"),
        (["-m", "/nonexistent/model.pth"], "no such file"),
    ],
)
def test_cli_prune_bad_input_is_one_line(
    source_checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    code = main(["prune", "-m", str(source_checkpoint), "-o", str(tmp_path), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err
    assert len(err.splitlines()) == 1


def test_pruned_model_exports_to_onnx_that_matches_pytorch(
    source_checkpoint: Path, tmp_path: Path, demo_shards: Path, demo_dataset: DemoDataset
) -> None:
    import onnx

    from maskops.export.exporter import export_onnx

    run_prune(source_checkpoint, tmp_path / "pruned", threshold=1.0)
    spec = make_spec(demo_shards, demo_dataset.val_json)
    pruned = export_onnx(
        tmp_path / "pruned" / "model.pth", spec, tmp_path / "pruned.onnx", log=lambda _: None
    )
    assert pruned.parity.passed, pruned.parity.summary()
    unpruned = export_onnx(source_checkpoint, spec, tmp_path / "full.onnx", log=lambda _: None)

    def conv_weight_elements(path: Path) -> int:
        graph = image_graph(onnx.load(str(path)))
        conv_weights = {n.input[1] for n in graph.node if n.op_type == "Conv"}
        return sum(
            int(torch.tensor(list(i.dims)).prod())
            for i in graph.initializer
            if i.name in conv_weights
        )

    # The graph carries the physically smaller convolutions, not masked full-size ones.
    assert conv_weight_elements(pruned.onnx_path) < 0.8 * conv_weight_elements(unpruned.onnx_path)


@pytest.mark.parametrize(("max_level", "side"), [(5, 128), (7, 128), (8, 256)])
def test_trace_input_covers_the_coarsest_level(max_level: int, side: int) -> None:
    config = MaskRCNNConfig(nlayers=10, max_level=max_level)
    assert trace_input(config).shape == (1, 3, side, side)
