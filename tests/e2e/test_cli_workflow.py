"""The TAO-style command-line workflow end to end, driving the installed ``maskops``.

One CI-sized scenario on generated data: demo-data -> dataset_convert (train, val) -> spec
check -> train (checkpoints, status.json, TensorBoard events) -> train again (resumes; a
longer total_steps continues from the checkpoint step) -> evaluate (24 COCO metrics) ->
inference (annotated images, COCO results that pycocotools' loadRes accepts) -> prune ->
train from pruned_model_path -> inference with the retrained pruned model -> export ONNX fp32
(validated against PyTorch) -> evaluate the ONNX model -> publish to a Triton model
repository; plus one-line errors for bad input.

The spec is tests/fixtures/specs/demo_resnet18.txt made CI-sized by editing its text
(resnet10, 128 px, a handful of steps) and saved next to the generated data with relative
data paths, which the commands resolve against the spec file's directory. Steps share
module-scoped fixtures, so any single test can run alone.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

REPO = Path(__file__).resolve().parents[2]
DEMO_SPEC = REPO / "tests" / "fixtures" / "specs" / "demo_resnet18.txt"

TRAIN_STEPS = 6
EVAL_EVERY = 3
EXTENDED_STEPS = 8
PRUNED_STEPS = 2
COMMAND_TIMEOUT_S = 600

METRIC_NAMES = [
    prefix + name
    for prefix in ("", "mask_")
    for name in (
        "AP",
        "AP50",
        "AP75",
        "APs",
        "APm",
        "APl",
        "ARmax1",
        "ARmax10",
        "ARmax100",
        "ARs",
        "ARm",
        "ARl",
    )
]
DEMO_CATEGORIES = {1: "circle", 3: "square", 7: "triangle"}

# CI-sized values for the demo spec's fields (each must occur exactly once in the fixture).
CI_OVERRIDES: dict[str, str] = {
    "use_amp": "False",
    "train_batch_size": "2",
    "init_learning_rate": "0.004",
    "warmup_learning_rate": "0.0004",
    "warmup_steps": "2",
    "learning_rate_steps": '"[100]"',
    "learning_rate_decay_levels": '"[0.1]"',
    "total_steps": str(TRAIN_STEPS),
    "num_steps_per_eval": str(EVAL_EVERY),
    "eval_batch_size": "4",
    "visualize_images_summary": "False",
    "image_size": '"(128, 128)"',
    "eval_samples": "4",
    "n_workers": "0",
    "nlayers": "10",
    "min_level": "3",
    "max_level": "5",
    "rpn_batch_size_per_im": "64",
    "batch_size_per_im": "32",
    "fast_rcnn_mlp_head_dim": "128",
    "train_rpn_pre_nms_topn": "200",
    "train_rpn_post_nms_topn": "100",
    "test_rpn_pre_nms_topn": "100",
    "test_rpn_post_nms_topn": "50",
    "test_detections_per_image": "20",
    "gt_mask_size": "28",
    "mrcnn_resolution": "16",
}
DATA_PATHS = (
    '    training_file_pattern: "shards/train*"\n'
    '    validation_file_pattern: "shards/val*"\n'
    '    val_json_file: "demo/annotations/val.json"\n'
)


def edit_spec(text: str, values: dict[str, str]) -> str:
    """``text`` with each ``field: value`` line of ``values`` rewritten (comments dropped)."""
    for name, value in values.items():
        text, count = re.subn(
            rf"^(\s*){name}:[^\n]*$", rf"\g<1>{name}: {value}", text, flags=re.MULTILINE
        )
        assert count == 1, f"{DEMO_SPEC.name}: field {name} occurs {count} times"
    return text


# --------------------------------------------------------------------------- helpers


def maskops_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m``."""
    script = Path(sys.executable).parent / "maskops"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "maskops.cli.main"]


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str


def maskops(cwd: Path, *args: str | Path, expect: int = 0) -> Run:
    """Run ``maskops ARGS`` in ``cwd``; fail with its output unless it exits ``expect``."""
    proc = subprocess.run(
        [*maskops_command(), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    run = Run(proc.returncode, proc.stdout, proc.stderr)
    if run.returncode != expect:
        pytest.fail(
            f"maskops {' '.join(map(str, args))}: exit {run.returncode}, expected {expect}\n"
            f"--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}"
        )
    return run


def assert_finite_metrics(metrics: dict[str, float]) -> None:
    missing = [name for name in METRIC_NAMES if name not in metrics]
    assert not missing, f"metrics missing: {missing}"
    for name in METRIC_NAMES:
        value = metrics[name]
        # COCOeval reports -1 for an area range without ground truth.
        assert math.isfinite(value) and (value == -1.0 or 0.0 <= value <= 1.0), (name, value)


def one_error_line(run: Run, command: str) -> str:
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{run.stderr}"
    assert lines[0].startswith(f"maskops {command}: error: "), lines[0]
    assert "Traceback" not in run.stderr
    return lines[0]


def status(run_dir: Path) -> dict:
    data: dict = json.loads((run_dir / "status.json").read_text())
    return data


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-data and dataset_convert output plus ``spec.txt``, all relative to one dir."""
    root = tmp_path_factory.mktemp("cli_workflow")
    maskops(root, "demo-data", "-o", "demo", "--images", "32", "--size", "128", "128")
    for split in ("train", "val"):
        run = maskops(
            root,
            "dataset_convert",
            "-i",
            f"demo/images/{split}",
            "-a",
            f"demo/annotations/{split}.json",
            "-o",
            "shards",
        )
        assert "findings: none" in run.stdout, run.stdout
    text = edit_spec(DEMO_SPEC.read_text(), CI_OVERRIDES)
    text, count = re.subn(r"^data_config \{\n", "data_config {\n" + DATA_PATHS, text, flags=re.M)
    assert count == 1
    (root / "spec.txt").write_text(text)
    return root


@pytest.fixture(scope="module")
def trained(work: Path) -> Path:
    """``maskops train`` into ``run/``: checkpoints at steps 3 and 6."""
    maskops(work, "train", "-e", "spec.txt", "-d", "run")
    return work / "run"


@pytest.fixture(scope="module")
def checkpoint(trained: Path) -> Path:
    return trained / f"model.step-{TRAIN_STEPS}.pth"


@pytest.fixture(scope="module")
def pruned(work: Path, checkpoint: Path) -> Path:
    """``maskops prune`` of the trained model into ``pruned/``."""
    # Barely trained filters have similar norms: only a high threshold removes any.
    maskops(work, "prune", "-m", checkpoint, "-o", "pruned", "-pth", "0.9", "-pg", "8", "-nf", "16")
    return work / "pruned"


@pytest.fixture(scope="module")
def pruned_run(work: Path, pruned: Path) -> Path:
    """A few training steps from ``pruned_model_path`` into ``run_pruned/``."""
    text = edit_spec(
        (work / "spec.txt").read_text(),
        {"total_steps": str(PRUNED_STEPS), "num_steps_per_eval": str(PRUNED_STEPS)},
    )
    (work / "spec_pruned.txt").write_text('pruned_model_path: "pruned/model.pth"\n' + text)
    maskops(work, "train", "-e", "spec_pruned.txt", "-d", "run_pruned")
    return work / "run_pruned"


@pytest.fixture(scope="module")
def pruned_checkpoint(pruned_run: Path) -> Path:
    return pruned_run / f"model.step-{PRUNED_STEPS}.pth"


@pytest.fixture(scope="module")
def exported(work: Path, pruned_checkpoint: Path) -> Path:
    """The retrained pruned model exported to ONNX fp32 (the export validates parity)."""
    onnx_path = work / "export" / "model.onnx"
    run = maskops(
        work,
        "export",
        "-m",
        pruned_checkpoint,
        "-e",
        "spec_pruned.txt",
        "-o",
        onnx_path,
        "--data_type",
        "fp32",
    )
    assert "parity" in run.stdout, run.stdout
    return onnx_path


# --------------------------------------------------------------------------- tests


def test_help_lists_every_command() -> None:
    from maskops.cli.main import COMMAND_MODULES

    run = maskops(REPO, "--help")
    listed = set(re.findall(r"^\s{4}(\S+)", run.stdout, flags=re.MULTILINE))
    for module in COMMAND_MODULES:
        # demo_data is the one hyphenated command.
        name = "demo-data" if module == "demo_data" else module
        assert name in listed, f"maskops --help does not list {name}:\n{run.stdout}"


def test_spec_check_resolves_relative_paths(work: Path) -> None:
    run = maskops(work, "spec", "check", "spec.txt", "--resolve-paths")
    spec = json.loads(run.stdout)
    assert spec["maskrcnn_config"]["nlayers"] == 10
    assert spec["data_config"]["image_size"] == [128, 128]
    assert spec["data_config"]["training_file_pattern"] == f"{work}/shards/train*"
    assert spec["data_config"]["val_json_file"] == f"{work}/demo/annotations/val.json"


def test_demo_spec_checks_unchanged() -> None:
    run = maskops(REPO, "spec", "check", DEMO_SPEC)
    spec = json.loads(run.stdout)
    assert spec["maskrcnn_config"]["nlayers"] == 18
    assert spec["data_config"]["image_size"] == [256, 256]
    assert spec["data_config"]["num_classes"] == len(DEMO_CATEGORIES) + 1


def test_spec_with_typo_fails_with_field_and_line(work: Path) -> None:
    text = (work / "spec.txt").read_text()
    line = next(n for n, s in enumerate(text.splitlines(), 1) if s.strip().startswith("nlayers:"))
    (work / "typo.txt").write_text(text.replace("nlayers:", "nlayer:", 1))
    for args in (("spec", "check", "typo.txt"), ("train", "-e", "typo.txt", "-d", "typo_run")):
        error = one_error_line(maskops(work, *args, expect=2), args[0])
        assert f"typo.txt:{line}:" in error and "nlayer" in error, error
    assert not (work / "typo_run").exists() or not list((work / "typo_run").glob("*.pth"))


def test_train_writes_checkpoints_status_and_events(trained: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert sorted(p.name for p in trained.glob("model.step-*.pth")) == [
        f"model.step-{EVAL_EVERY}.pth",
        f"model.step-{TRAIN_STEPS}.pth",
    ]
    state = status(trained)
    assert state["state"] == "succeeded"
    assert (state["step"], state["total_steps"]) == (TRAIN_STEPS, TRAIN_STEPS)
    assert Path(state["last_checkpoint"]).name == f"model.step-{TRAIN_STEPS}.pth"
    assert_finite_metrics(state["metrics"])
    assert math.isfinite(state["metrics"]["Total loss"])

    events = EventAccumulator(str(trained / "events"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("Total loss", "Mask loss", "RPN score loss", "learning rate", "mask_AP", "AP"):
        assert tag in tags, f"TensorBoard scalars lack {tag!r}: {sorted(tags)}"
    assert max(e.step for e in events.Scalars("Total loss")) == TRAIN_STEPS


def test_train_again_resumes(work: Path, trained: Path) -> None:
    # In a copy: the other steps use the original run's checkpoint.
    run_dir = work / "run_resumed"
    shutil.copytree(trained, run_dir)
    before = (run_dir / f"model.step-{TRAIN_STEPS}.pth").read_bytes()

    # Total already reached: nothing more to train, the checkpoint is left alone.
    run = maskops(work, "train", "-e", "spec.txt", "-d", run_dir.name)
    assert f"resuming from {run_dir.name}/model.step-{TRAIN_STEPS}.pth" in run.stderr
    assert f"step {TRAIN_STEPS}/{TRAIN_STEPS}" in run.stdout
    assert (run_dir / f"model.step-{TRAIN_STEPS}.pth").read_bytes() == before

    # A longer total continues from the checkpoint step.
    longer = edit_spec((work / "spec.txt").read_text(), {"total_steps": str(EXTENDED_STEPS)})
    (work / "spec_longer.txt").write_text(longer)
    run = maskops(work, "train", "-e", "spec_longer.txt", "-d", run_dir.name)
    assert f"at step {TRAIN_STEPS} of {EXTENDED_STEPS}" in run.stderr, run.stderr[-2000:]
    assert f"finished at step {EXTENDED_STEPS}/{EXTENDED_STEPS}" in run.stdout
    assert (run_dir / f"model.step-{EXTENDED_STEPS}.pth").exists()
    assert status(run_dir)["step"] == EXTENDED_STEPS
    logged_steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert logged_steps == sorted(logged_steps) and logged_steps[-1] == EXTENDED_STEPS


def test_evaluate_checkpoint(work: Path, trained: Path, checkpoint: Path) -> None:
    out = work / "eval" / "metrics.json"
    run = maskops(work, "evaluate", "-e", "spec.txt", "-m", checkpoint, "-o", out)
    metrics = json.loads(out.read_text())["metrics"]
    assert_finite_metrics(metrics)
    for name in METRIC_NAMES:
        assert re.search(rf"^{name}\s", run.stdout, flags=re.MULTILINE), name
    # The same evaluator ran at the end of training on the same model and images.
    at_training_end = status(trained)["metrics"]
    for name in METRIC_NAMES:
        assert metrics[name] == pytest.approx(at_training_end[name], abs=1e-6), name


def test_evaluate_missing_checkpoint_is_one_line_error(work: Path) -> None:
    run = maskops(work, "evaluate", "-e", "spec.txt", "-m", "no_such_model.pth", expect=2)
    assert "no_such_model.pth" in one_error_line(run, "evaluate")


def test_train_missing_pruned_model_is_one_line_error(work: Path) -> None:
    text = 'pruned_model_path: "no_such_model.pth"\n' + (work / "spec.txt").read_text()
    (work / "spec_missing_model.txt").write_text(text)
    run = maskops(work, "train", "-e", "spec_missing_model.txt", "-d", "run_missing", expect=2)
    error = one_error_line(run, "train")
    assert "pruned_model_path" in error and "no_such_model.pth" in error, error
    assert status(work / "run_missing")["state"] == "failed"
    assert not list((work / "run_missing").glob("*.pth"))


@pytest.mark.parametrize("model", ["trained", "pruned"])
def test_inference_writes_annotated_images_and_coco_results(
    work: Path, model: str, request: pytest.FixtureRequest
) -> None:
    """The trained checkpoint, and the pruned model retrained from ``pruned_model_path``."""
    if model == "trained":
        spec, weights = "spec.txt", request.getfixturevalue("checkpoint")
    else:
        spec = "spec_pruned.txt"
        weights = request.getfixturevalue("pruned_checkpoint")
    images = work / f"inference_input_{model}"
    shutil.copytree(work / "demo" / "images" / "val", images)
    # An unreadable file is reported and skipped, not fatal. (Named like the others: image
    # ids are the file stems only when every stem is an integer.)
    (images / "999999.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    run = maskops(
        work,
        "inference",
        "-e",
        spec,
        "-m",
        weights,
        "-i",
        images,
        "-o",
        f"annotated_{model}",
        "-l",
        f"labels_{model}",
        "-t",
        "0.0",
        "--include_mask",
    )
    assert "skipped 1" in run.stdout and "999999.jpg" in run.stdout + run.stderr
    sources = sorted(p for p in images.glob("*.jpg") if p.name != "999999.jpg")
    annotated = sorted((work / f"annotated_{model}").iterdir())
    assert [p.stem for p in annotated] == [p.stem for p in sources]
    changed = 0
    for source, drawn in zip(sources, annotated, strict=True):
        with Image.open(source) as a, Image.open(drawn) as b:
            assert a.size == b.size
            diff = np.abs(np.asarray(a.convert("RGB"), np.int16) - np.asarray(b.convert("RGB")))
            changed += int(diff.max() > 40)

    gt = COCO(str(work / "demo" / "annotations" / "val.json"))
    results = [
        det
        for source in sources
        for det in json.loads((work / f"labels_{model}" / f"{source.stem}.json").read_text())
    ]
    assert results, "no detections at threshold 0"
    assert changed > 0, "no annotated image differs from its source"
    assert {det["image_id"] for det in results} <= set(gt.getImgIds())
    assert {det["category_id"] for det in results} <= set(DEMO_CATEGORIES)
    loaded = gt.loadRes(results)
    for ann in loaded.loadAnns(loaded.getAnnIds()):
        image = gt.imgs[ann["image_id"]]
        assert ann["segmentation"]["size"] == [image["height"], image["width"]]
        assert 0 <= ann["score"] <= 1


def test_prune_writes_smaller_model_and_report(pruned: Path) -> None:
    report = json.loads((pruned / "prune_report.json").read_text())
    assert (pruned / "model.pth").is_file()
    assert 0 < report["params_after"] < report["params_before"]
    assert report["macs_after"] < report["macs_before"]
    assert any(layer["out_after"] < layer["out_before"] for layer in report["layers"])


def test_train_from_pruned_model(pruned: Path, pruned_run: Path, pruned_checkpoint: Path) -> None:
    import torch

    report = json.loads((pruned / "prune_report.json").read_text())
    state = status(pruned_run)
    assert (state["state"], state["step"]) == ("succeeded", PRUNED_STEPS)
    assert_finite_metrics(state["metrics"])
    saved = torch.load(pruned_checkpoint, map_location="cpu", weights_only=True)
    params = sum(t.numel() for name, t in saved["model"].items() if not is_buffer(name))
    assert params == report["params_after"]


def is_buffer(name: str) -> bool:
    return name.endswith(("running_mean", "running_var", "num_batches_tracked"))


def test_export_onnx_and_evaluate_it(work: Path, pruned_run: Path, exported: Path) -> None:
    import onnx

    model = onnx.load(str(exported))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["images"]
    assert {"boxes", "scores", "labels", "masks"} <= {o.name for o in model.graph.output}

    out = work / "eval_onnx.json"
    maskops(work, "evaluate", "-e", "spec_pruned.txt", "-m", exported, "-o", out)
    metrics = json.loads(out.read_text())["metrics"]
    assert_finite_metrics(metrics)
    # The exported graph matches PyTorch: the same metrics as the training-end evaluation.
    at_training_end = status(pruned_run)["metrics"]
    for name in METRIC_NAMES:
        assert metrics[name] == pytest.approx(at_training_end[name], abs=1e-3), name


def test_publish_to_model_repository(work: Path, exported: Path) -> None:
    repo = work / "model_repository"
    run = maskops(work, "publish", "-m", exported, "-n", "shapes", "--repository", repo)
    assert "version 1" in run.stdout
    config = (repo / "shapes" / "config.pbtxt").read_text()
    assert 'name: "shapes"' in config and 'platform: "ensemble"' in config
    from maskops.serving import EnsembleNames

    onnx_files = list((repo / EnsembleNames("shapes").net).glob("*/model.onnx"))
    assert len(onnx_files) == 1
    assert onnx_files[0].read_bytes() == exported.read_bytes()
    label_map = json.loads((repo / "shapes" / "label_map.json").read_text())
    assert {entry["id"]: entry["name"] for entry in label_map} == DEMO_CATEGORIES

    run = maskops(work, "publish", "-m", exported, "-n", "shapes", "--repository", repo)
    assert "version 2" in run.stdout
