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
from maskops.export.graph import GraphMetadata, set_metadata
from maskops.serving import EnsembleNames, PublishError, existing_versions, publish
from maskops.serving.processing import (
    coco_results,
    decode_results,
    encode_results,
    preprocess_image,
    unpad_detections,
)
from maskops.spec.models import ExperimentSpec

LABELS = LabelMap.from_coco_categories([{"id": 3, "name": "square"}, {"id": 7, "name": "tri"}])


@pytest.fixture
def fake_export(tmp_path: Path) -> Path:
    """A maskops-tagged ONNX file (an Identity graph: publishing never runs it)."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["images"], ["boxes"])],
        "g",
        [onnx.helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT, [1, 3, 64, 96])],
        [onnx.helper.make_tensor_value_info("boxes", onnx.TensorProto.FLOAT, [1, 3, 64, 96])],
    )
    model = onnx.helper.make_model(graph)
    set_metadata(
        model,
        GraphMetadata(
            spec=ExperimentSpec(),
            label_map=LABELS,
            data_type="fp16",
            image_size=(64, 96),
            max_detections=7,
            mask_resolution=14,
            max_batch_size=3,
        ),
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


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
    assert (repo / names.net / "1" / "model.py").is_file()
    assert (
        LabelMap.from_json(json.loads((repo / "shapes" / "label_map.json").read_text())) == LABELS
    )
    settings = json.loads((repo / names.preprocess / "1" / "settings.json").read_text())
    assert settings == {"image_size": [64, 96], "data_type": "fp16"}


def test_each_publish_is_a_new_version(tmp_path, fake_export):
    repo = tmp_path / "repo"
    assert [publish(fake_export, repo, "m") for _ in range(3)] == [1, 2, 3]
    assert existing_versions(repo, "m") == [1, 2, 3]
    history = json.loads((repo / "m" / "versions.json").read_text())
    assert [h["version"] for h in history] == [1, 2, 3]
    assert not list(repo.glob("*/.*staging"))


def test_tensorrt_variant(tmp_path, fake_export):
    repo = tmp_path / "repo"
    publish(fake_export, repo, "m", net_backend="tensorrt")
    net = _config(repo / "m_net" / "config.pbtxt")
    assert net.platform == "tensorrt_plan" and net.max_batch_size == 1
    assert _config(repo / "m" / "config.pbtxt").max_batch_size == 1
    assert not (repo / "m_net" / "1" / "model.py").exists()


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
