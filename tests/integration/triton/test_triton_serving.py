"""The published repository in a real Triton (the PyPI binary, python backend, CPU).

One server per module (unique ports, always stopped); the export is the demo-trained
``tiny_checkpoint`` as fp32 ONNX.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch

from maskops.export import OnnxPredictor, export_onnx
from maskops.serving import EnsembleNames, existing_versions, publish
from maskops.serving import client as triton
from maskops.serving.processing import coco_results, preprocess_image
from maskops_triton.launcher import TritonServer, free_port

pytestmark = pytest.mark.integration

NAME = "shapes"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint, tiny_spec) -> Path:
    out = tmp_path_factory.mktemp("triton_export") / "shapes.onnx"
    return export_onnx(
        tiny_checkpoint, tiny_spec, out, max_batch_size=4, log=lambda _: None
    ).onnx_path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, exported: Path) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("model_repository")
    assert publish(exported, repository, NAME) == 1
    with TritonServer(repository, models=EnsembleNames(NAME).load_order) as running:
        yield running


@pytest.fixture(scope="module")
def val_images(demo_dataset) -> list[bytes]:
    paths = sorted(Path(demo_dataset.val_images).glob("*.jpg"))[:3]
    return [p.read_bytes() for p in paths]


def test_repository_layout(server: TritonServer):
    repo = server.repository
    for model in EnsembleNames(NAME).load_order:
        assert (repo / model / "config.pbtxt").is_file()
        assert (repo / model / "1").is_dir()
    assert (repo / f"{NAME}_net" / "1" / "model.onnx").is_file()
    assert (repo / NAME / "label_map.json").is_file()
    assert triton.is_ready(server.http_url, NAME)


def test_infer_returns_coco_results_matching_in_process(server, exported, val_images):
    answers = triton.infer_images(server.http_url, NAME, val_images, score_threshold=0.05)
    assert len(answers) == len(val_images)
    predictor = OnnxPredictor(exported)
    label_map = predictor.metadata.label_map
    total = 0
    for index, (data, got) in enumerate(zip(val_images, answers, strict=True)):
        image, scale, orig_hw = preprocess_image(data, predictor.image_size)
        output = predictor([torch.from_numpy(image)])[0]
        want = coco_results(
            output,
            scale=scale,
            orig_hw=orig_hw,
            label_map=label_map,
            score_threshold=0.05,
            image_id=index,
        )
        assert len(got) == len(want)
        total += len(got)
        for g, w in zip(got, want, strict=True):
            assert g["image_id"] == index
            assert g["category_id"] == w["category_id"]
            assert g["category_name"] in {"circle", "square", "triangle"}
            np.testing.assert_allclose(g["bbox"], w["bbox"], atol=1e-3)
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)
            assert g["segmentation"] == w["segmentation"]
            decoded = mask_util.decode(g["segmentation"])
            assert decoded.shape == orig_hw
    assert total > 0, "the tiny model detected nothing at 0.05 on 3 images"


def test_score_threshold_filters(server, val_images):
    everything = triton.infer_images(server.http_url, NAME, val_images[:1], score_threshold=0.0)
    confident = triton.infer_images(server.http_url, NAME, val_images[:1], score_threshold=0.5)
    assert all(d["score"] >= 0.5 for d in confident[0])
    assert len(confident[0]) <= len(everything[0])


def test_errors_are_typed(server, val_images):
    with pytest.raises(triton.InvalidImage, match="image 1"):
        triton.infer_images(server.http_url, NAME, [val_images[0], b"not an image"])
    with pytest.raises(triton.ModelNotFound):
        triton.infer_images(server.http_url, "no_such_model", val_images[:1])
    with pytest.raises(triton.TritonUnavailable):
        triton.infer_images(f"127.0.0.1:{free_port()}", NAME, val_images[:1])
    assert not triton.is_ready(f"127.0.0.1:{free_port()}")


def test_version_rollover_loses_no_request(server, exported, val_images):
    url = server.http_url
    before = triton.infer_images(url, NAME, val_images[:1])[0]
    version = publish(exported, server.repository, NAME)
    assert version == 2 == max(existing_versions(server.repository, NAME))
    failures: list[BaseException] = []
    answered = 0
    stop = threading.Event()

    def hammer() -> None:
        nonlocal answered
        while not stop.is_set():
            try:
                got = triton.infer_images(url, NAME, val_images[:1])[0]
                assert len(got) == len(before)
                answered += 1
            except BaseException as exc:
                failures.append(exc)

    clients = [threading.Thread(target=hammer) for _ in range(2)]
    for thread in clients:
        thread.start()
    try:
        time.sleep(1.0)
        triton.roll_out(url, NAME)
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=120)
    assert not failures, failures[:3]
    assert answered >= 2
    for model in EnsembleNames(NAME).load_order:
        assert triton.served_version(url, model) == "2"
