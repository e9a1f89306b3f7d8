"""Publishing to a model repository, the served processing functions, without a server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from google.protobuf import text_format
from PIL import Image
from tritonclient.grpc import model_config_pb2

from maskops.cli.main import main as cli_main
from maskops.data.labels import LabelMap
from maskops.evaluation.errors import ImageReadError
from maskops.serving import EnsembleNames, PublishError, existing_versions, publish
from maskops.serving.placement import Placement
from maskops.serving.processing import (
    coco_results,
    decode_results,
    encode_results,
    preprocess_image,
    unpad_detections,
)
from maskops.serving.publish_options import NETWORK_QUEUE_DELAY_US
from maskops.serving.repository import NetBackend
from tests.support.fake_export import LABELS, fake_engine, fake_onnx_export

GPU = Placement("gpu")


@pytest.fixture
def fake_export(tmp_path: Path) -> Path:
    """A maskops-tagged ONNX file of a dynamic batch (publishing never runs it)."""
    return fake_onnx_export(tmp_path / "m.onnx", "batch")


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_publish_writes_a_valid_ensemble(tmp_path, fake_export):
    repo = tmp_path / "repo"
    assert publish(fake_export, repo, "shapes") == 1
    names = EnsembleNames("shapes")
    configs = {m: _config(repo / m / "config.pbtxt") for m in names.load_order}
    net = configs[names.net]
    assert net.backend == "python" and net.max_batch_size == 3
    assert [tuple(i.dims) for i in net.input] == [(3, 64, 96)]
    assert {o.name: tuple(o.dims) for o in net.output} == {
        "boxes": (7, 4),
        "scores": (7,),
        "labels": (7,),
        "masks": (7, 14, 14),
        "num_detections": (1,),
    }
    assert net.dynamic_batching is not None and net.version_policy.latest.num_versions == 1
    ensemble = configs["shapes"]
    assert ensemble.platform == "ensemble"
    assert [i.name for i in ensemble.input] == ["image_bytes", "score_threshold"]
    assert [o.name for o in ensemble.output] == ["detections_json"]
    steps = ensemble.ensemble_scheduling.step
    assert [s.model_name for s in steps] == [names.preprocess, names.net, names.postprocess]
    # every intermediate tensor an ensemble step reads is produced by an earlier step
    produced = {"image_bytes", "score_threshold"}
    for s in steps:
        assert set(s.input_map.values()) <= produced
        produced |= set(s.output_map.values())
    post_inputs = {i.name for i in configs[names.postprocess].input}
    assert set(steps[2].input_map) == post_inputs
    assert (repo / names.net / "1" / "model.onnx").read_bytes() == fake_export.read_bytes()
    for part in names.parts:
        assert (repo / part / "1" / "model.py").is_file()
        assert (repo / part / "1" / "maskops_serving_ops.py").is_file()
        assert _config(repo / part / "config.pbtxt").name == part
    assert (
        LabelMap.from_json(json.loads((repo / "shapes" / "label_map.json").read_text())) == LABELS
    )
    settings = json.loads((repo / names.preprocess / "1" / "settings.json").read_text())
    assert settings == {
        "image_size": [64, 96],
        "data_type": "fp16",
        "max_batch_size": 3,
        "static_batch_size": None,
    }


def test_each_publish_is_a_new_version(tmp_path, fake_export):
    repo = tmp_path / "repo"
    assert [publish(fake_export, repo, "m") for _ in range(3)] == [1, 2, 3]
    assert existing_versions(repo, "m") == [1, 2, 3]
    history = json.loads((repo / "m" / "versions.json").read_text())
    assert [h["version"] for h in history] == [1, 2, 3]
    assert not list(repo.glob("*/.*staging"))


def test_tensorrt_variant(tmp_path, fake_export):
    repo = tmp_path / "repo"
    engine = fake_engine(fake_export)
    publish(fake_export, repo, "m", net_backend="tensorrt", placement=GPU)
    net_dir = repo / EnsembleNames("m").net
    net = _config(net_dir / "config.pbtxt")
    assert net.platform == "tensorrt_plan" and net.max_batch_size == 3
    assert net.HasField("dynamic_batching")
    assert _config(repo / "m" / "config.pbtxt").max_batch_size == 3
    assert not (net_dir / "1" / "model.py").exists()
    assert (net_dir / "1" / "model.plan").read_bytes() == engine.read_bytes()
    assert not (net_dir / "1" / "model.onnx").exists()
    settings = json.loads((net_dir / "1" / "settings.json").read_text())
    assert (settings["max_batch_size"], settings["static_batch_size"]) == (3, None)


def test_static_batch_exports_on_graph_backends(tmp_path):
    """A batch-1 graph (exported before batching, or --static_batch_size 1) is served at
    batch 1 by the tensorrt backend, which checks a plan's dimensions after the batch one.
    Triton's onnxruntime backend refuses to load a graph of a fixed first dimension under
    a max_batch_size, and no backend of Triton's fills a larger static batch: publish
    refuses those with the way out."""
    names, repo = EnsembleNames("m"), tmp_path / "repo"
    legacy = fake_onnx_export(tmp_path / "legacy.onnx", 1)
    fake_engine(legacy, profile=(1, 1, 1))
    publish(legacy, repo, "m", net_backend="tensorrt", placement=GPU)
    net = _config(repo / names.net / "config.pbtxt")
    assert net.max_batch_size == 1 and not net.HasField("dynamic_batching")
    assert _config(repo / "m" / "config.pbtxt").max_batch_size == 1
    with pytest.raises(
        PublishError,
        match=r"static batch of 1: Triton's onnxruntime backend batches a dynamic batch only; "
        r"export without --static_batch_size, or publish with --net_backend python, or "
        r"tensorrt with an engine",
    ):
        publish(legacy, repo, "m", net_backend="onnxruntime", placement=GPU)
    static = fake_onnx_export(tmp_path / "static.onnx", 3)
    refusals: list[tuple[NetBackend, str]] = [
        ("onnxruntime", "batches a dynamic"),
        ("tensorrt", "runs batch 1"),
    ]
    for backend, takes in refusals:
        with pytest.raises(PublishError, match=rf"batch of 3: Triton's {backend} backend {takes}"):
            publish(static, repo, "m", net_backend=backend, placement=GPU)
    assert existing_versions(repo, "m") == [1]


def test_static_batch_on_the_python_backend(tmp_path):
    """The python network fills a static batch itself: it batches like a dynamic one."""
    static = fake_onnx_export(tmp_path / "static.onnx", 3)
    publish(static, tmp_path / "repo", "m")
    net_dir = tmp_path / "repo" / EnsembleNames("m").net
    assert _config(net_dir / "config.pbtxt").max_batch_size == 3
    assert json.loads((net_dir / "1" / "settings.json").read_text())["static_batch_size"] == 3


def test_publish_rejects_bad_input(tmp_path, fake_export):
    with pytest.raises(PublishError, match="model name"):
        publish(fake_export, tmp_path, "bad name")
    with pytest.raises(PublishError, match="no such export"):
        publish(tmp_path / "missing.onnx", tmp_path, "m")
    plain = tmp_path / "plain.onnx"
    model = onnx.load(str(fake_export))
    del model.metadata_props[:]
    onnx.save(model, str(plain))
    with pytest.raises(PublishError, match="not a maskops ONNX export"):
        publish(plain, tmp_path / "r", "m")
    tao = fake_onnx_export(tmp_path / "tao.onnx", "batch", output_layout="tao")
    with pytest.raises(PublishError, match=r"'tao' output layout .* --output_layout maskops"):
        publish(tao, tmp_path / "r", "m")
    with pytest.raises(PublishError, match="processing_instances 0: each model needs"):
        publish(fake_export, tmp_path / "r", "m", processing_instances=0)
    with pytest.raises(PublishError, match="max_queue_delay_us -1: must be 0 or more"):
        publish(fake_export, tmp_path / "r", "m", max_queue_delay_us=-1)
    assert not (tmp_path / "r").exists()


def test_publish_cli(tmp_path, fake_export, capsys):
    assert (
        cli_main(
            ["publish", "-m", str(fake_export), "-n", "cli", "--repository", str(tmp_path / "r")]
        )
        == 0
    )
    assert "version 1" in capsys.readouterr().out
    assert cli_main(["publish", "-m", str(tmp_path / "x.onnx"), "-n", "cli"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such export" in err[0]
    names = EnsembleNames("cli")
    default_wait = _config(tmp_path / "r" / names.net / "config.pbtxt").dynamic_batching
    assert default_wait.max_queue_delay_microseconds == NETWORK_QUEUE_DELAY_US
    repository = ["--repository", str(tmp_path / "r")]
    counts = ["--instances", "2", "--processing_instances", "3", "--max_queue_delay_us", "0"]
    assert cli_main(["publish", "-m", str(fake_export), "-n", "cli", *repository, *counts]) == 0
    read = {m: _config(tmp_path / "r" / m / "config.pbtxt") for m in names.parts}
    assert [g.count for g in read[names.net].instance_group] == [2]
    assert [g.count for g in read[names.preprocess].instance_group] == [3]
    assert [g.count for g in read[names.postprocess].instance_group] == [3]
    assert read[names.net].HasField("dynamic_batching")  # batching, with no wait
    assert read[names.net].dynamic_batching.max_queue_delay_microseconds == 0


def _jpeg(height: int, width: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), 200, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_preprocess_image_resizes_pads_and_reports_scale():
    image, scale, orig_hw = preprocess_image(_jpeg(50, 200), (64, 96))
    assert image.shape == (3, 64, 96) and image.dtype == np.float32
    assert orig_hw == (50, 200) and scale == pytest.approx(96 / 200)
    assert image[:, :24].max() == pytest.approx(200 / 255, abs=1e-3)
    assert image[:, 24:].max() == 0.0  # padding below the resized 24-row image
    with pytest.raises(ImageReadError, match="upload 3"):
        preprocess_image(b"GIF89a nonsense", (64, 96), name="upload 3")


def test_unpad_and_coco_results_round_trip():
    d, m = 5, 14
    boxes = np.zeros((d, 4), np.float32)
    boxes[:2] = [[10, 10, 40, 30], [0, 0, 20, 20]]
    scores = np.array([0.9, 0.2, 0, 0, 0], np.float32)
    labels = np.array([2, 1, 0, 0, 0], np.int64)
    masks = np.zeros((d, m, m), np.float32)
    masks[:2] = 1.0
    out = unpad_detections(boxes, scores, labels, masks, np.array([2], np.int32))
    assert out["masks"].shape == (2, 1, m, m) and out["labels"].dtype == torch.int64
    results = coco_results(
        out, scale=0.5, orig_hw=(100, 120), label_map=LABELS, score_threshold=0.5
    )
    assert len(results) == 1
    assert results[0]["category_id"] == 7 and results[0]["category_name"] == "tri"
    assert results[0]["bbox"] == pytest.approx([20, 20, 60, 40])
    assert results[0]["segmentation"]["size"] == [100, 120]
    assert decode_results(encode_results(results)) == json.loads(json.dumps(results))


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for folders)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize(
    "other", ["shapes_net", "shapes_preprocess", "shapes_postprocess", "shapes.net", "_shapes.net"]
)
def test_internal_parts_are_out_of_reach_of_user_names(tmp_path, fake_export, other):
    repo = tmp_path / "repo"
    publish(fake_export, repo, "shapes")
    before = _snapshot(repo)
    if other.startswith("_"):
        # Users cannot name a model like a part: names start with a letter or digit.
        with pytest.raises(PublishError, match="model name"):
            publish(fake_export, repo, other)
        assert _snapshot(repo) == before
        return
    assert publish(fake_export, repo, other) == 1
    after = _snapshot(repo)
    assert {k: v for k, v in after.items() if k in before} == before  # shapes untouched
    mine, theirs = set(EnsembleNames("shapes").load_order), set(EnsembleNames(other).load_order)
    assert not mine & theirs
    assert {p.name for p in repo.iterdir()} == mine | theirs


def test_part_names_never_collide():
    users = ["a", "a.net", "a.b", "b", "a_net", "net", "a.preprocess", "x" * 64, "A-1.2_z"]
    models = [m for user in users for m in EnsembleNames(user).load_order]
    assert len(set(models)) == 4 * len(users)
    for user in users:
        for part in EnsembleNames(user).parts:
            assert part.startswith("_") and part.rsplit(".", 1)[0] == f"_{user}"


@pytest.mark.parametrize("name", ["", "_a", ".a", "-a", "a b", "é", "a/b", "x" * 65, "a\n"])
def test_model_names_follow_the_rule(tmp_path, fake_export, name):
    with pytest.raises(PublishError, match="model name"):
        publish(fake_export, tmp_path / "repo", name)
    assert not (tmp_path / "repo").exists()


def test_failed_publish_of_a_new_model_leaves_the_repository_as_it_was(tmp_path, fake_export):
    repo = tmp_path / "repo"
    publish(fake_export, repo, "other")
    # A file where the postprocess model's folder goes: staging fails after two parts.
    (repo / EnsembleNames("m").postprocess).write_text("in the way")
    before = _snapshot(repo)
    with pytest.raises(PublishError, match="unchanged"):
        publish(fake_export, repo, "m")
    assert _snapshot(repo) == before


def test_failure_after_moving_versions_undoes_everything(tmp_path, fake_export):
    repo = tmp_path / "repo"
    publish(fake_export, repo, "m")
    # The label map is written after the new versions are moved in and the configs
    # replaced; a folder in its place makes that last step fail.
    (repo / "m" / "label_map.json").unlink()
    (repo / "m" / "label_map.json").mkdir()
    before = _snapshot(repo)
    with pytest.raises(PublishError, match="unchanged"):
        publish(fake_export, repo, "m", max_batch_size=2)
    assert _snapshot(repo) == before
    assert existing_versions(repo, "m") == [1]


def test_bad_exports_and_history_change_nothing(tmp_path, fake_export):
    repo = tmp_path / "repo"
    publish(fake_export, repo, "m")
    before = _snapshot(repo)
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(fake_export.read_bytes()[: len(fake_export.read_bytes()) // 2])
    with pytest.raises(PublishError, match=r"corrupt\.onnx"):
        publish(corrupt, repo, "m")
    assert _snapshot(repo) == before
    (repo / "m" / "versions.json").write_text("{ truncated")
    before = _snapshot(repo)
    with pytest.raises(PublishError, match="publish history"):
        publish(fake_export, repo, "m")
    assert _snapshot(repo) == before


def test_leftovers_of_a_crashed_publish_do_not_wedge_the_next(tmp_path, fake_export):
    repo = tmp_path / "repo"
    names = EnsembleNames("shapes")
    assert publish(fake_export, repo, "shapes") == 1
    # Killed while staging version 2: staging folders, nothing moved.
    for model in names.load_order:
        (repo / model / ".2.staging").mkdir()
        (repo / model / ".2.staging" / "model.py").write_text("half written")
    assert publish(fake_export, repo, "shapes") == 2
    assert not list(repo.glob("*/.*staging"))
    # Killed between moves of version 3: the network's folder is in place, the rest not.
    (repo / names.net / "3").mkdir()
    (repo / names.net / ".3.staging").mkdir()
    assert publish(fake_export, repo, "shapes") == 4
    assert existing_versions(repo, "shapes") == [1, 2, 4]
    assert (repo / names.net / "4" / "model.onnx").read_bytes() == fake_export.read_bytes()
    assert not list(repo.glob("*/.*staging"))
