"""The torch network backend in the real Triton (PyPI binary, python backend, CPU).

The demo-trained ``tiny_checkpoint`` is published as it is (no export) with
``net_backend="torch"``: the network model runs the checkpoint with PyTorch inside Triton's
python backend, between the usual pre- and post-processing models. Its detections must
match in-process inference on the same checkpoint (the engine's torch preprocessing, the
eager model, the engine's post-processing) within the export's fp32 parity tolerances.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from maskops.export.parity import TOLERANCES, coco_results_as_detections, compare_detections
from maskops.serving import EnsembleNames, PublishError, publish
from maskops.serving import client as triton
from maskops.serving.launcher import TritonServer
from maskops.serving.placement import Placement
from maskops.serving.processing import coco_results, preprocess_image, unpad_detections
from maskops.serving.torch_network import TorchNetwork

pytestmark = pytest.mark.integration

NAME = "shapes_torch"


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path
) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("torch_repository")
    assert publish(tiny_checkpoint, repository, NAME, net_backend="torch", max_batch_size=4) == 1
    with TritonServer(repository, models=EnsembleNames(NAME).load_order) as running:
        yield running


@pytest.fixture(scope="module")
def val_images(demo_dataset) -> list[bytes]:
    paths = sorted(Path(demo_dataset.val_images).glob("*.jpg"))[:4]
    return [p.read_bytes() for p in paths]


def in_process(checkpoint: Path, images: list[bytes], threshold: float) -> list[list[dict]]:
    """The engine's results on the CPU: torch preprocessing, the eager checkpoint one image
    at a time, torch post-processing."""
    network = TorchNetwork(checkpoint, device="cpu", precision="fp32")
    answers = []
    for data in images:
        image, scale, orig_hw = preprocess_image(data, network.info.image_size)
        padded = [out[0].numpy() for out in network(torch.from_numpy(image)[None])]
        answers.append(
            coco_results(
                unpad_detections(*padded),
                scale=scale,
                orig_hw=orig_hw,
                label_map=network.info.label_map,
                score_threshold=threshold,
            )
        )
    return answers


def test_the_network_config_names_backend_device_and_precision(server: TritonServer):
    net = EnsembleNames(NAME).net
    assert (server.repository / net / "1" / "model.pth").is_file()
    assert not (server.repository / net / "1" / "model.onnx").exists()
    assert triton.network_placement(server.http_url, NAME) == {
        "net_backend": "torch",
        "device": "cpu",
        "precision": "fp32",
    }
    history = json.loads((server.repository / NAME / "versions.json").read_text())
    assert history[-1]["net_backend"] == "torch" and history[-1]["precision"] == "fp32"


def test_served_detections_match_in_process_inference(server, tiny_checkpoint, val_images):
    served = triton.infer_images(server.http_url, NAME, val_images, score_threshold=0.05)
    reference = in_process(tiny_checkpoint, val_images, 0.05)
    assert sum(len(r) for r in reference) > 0, "the tiny model detected nothing at 0.05"
    report = compare_detections(
        [coco_results_as_detections(r) for r in reference],
        [coco_results_as_detections(s) for s in served],
        data_type="fp32",
        tolerances=TOLERANCES["fp32"],
    )
    assert report.passed, report.summary()
    for got, want in zip(served, reference, strict=True):
        assert [g["segmentation"]["size"] for g in got] == [w["segmentation"]["size"] for w in want]


def test_publish_refuses_what_the_torch_backend_cannot_serve(tmp_path, tiny_checkpoint, exported):
    with pytest.raises(PublishError, match="ONNX export; the torch net backend serves"):
        publish(exported, tmp_path / "repo", NAME, net_backend="torch")
    with pytest.raises(PublishError, match=r"expected an exported \.onnx file"):
        publish(tiny_checkpoint, tmp_path / "repo", NAME)
    with pytest.raises(PublishError, match="precision bf16: autocast runs on GPUs only"):
        publish(tiny_checkpoint, tmp_path / "repo", NAME, net_backend="torch", precision="bf16")
    assert not (tmp_path / "repo").exists()
    gpu = Placement("gpu")
    publish(tiny_checkpoint, tmp_path / "gpu", NAME, net_backend="torch", placement=gpu)
    config = (tmp_path / "gpu" / EnsembleNames(NAME).net / "config.pbtxt").read_text()
    assert "KIND_GPU" in config and '"maskops_precision" value: { string_value: "auto" }' in config
