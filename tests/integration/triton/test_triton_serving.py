"""The published repository in a real Triton (the PyPI binary, python backend, CPU).

One server per module (unique ports, always stopped); the export is the demo-trained
``tiny_checkpoint`` as fp32 ONNX (``exported``, tests/integration/conftest.py). The served
models run the numpy ops of ``maskops_serving_ops`` (no torch in Triton); in-process
inference with the engine's torch pre/post-processing is the reference they must equal.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch
from PIL import Image

from maskops.export import OnnxPredictor
from maskops.serving import EnsembleNames, existing_versions, publish
from maskops.serving import client as triton
from maskops.serving.launcher import TritonServer, free_port
from maskops.serving.processing import coco_results, preprocess_image
from tests.conftest import PeakRss, large_jpeg
from tests.support.bench import load_bench_module

pytestmark = pytest.mark.integration

NAME = "shapes"


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


@pytest.fixture(scope="module")
def resized_image(val_images) -> bytes:
    """A val image at another size and aspect ratio: the served resize path runs."""
    image = Image.open(io.BytesIO(val_images[0])).convert("RGB").resize((301, 197))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def in_process(exported: Path, images: list[bytes], score_threshold: float) -> list[list[dict]]:
    """The engine's results: torch preprocessing, onnxruntime, torch post-processing."""
    predictor = OnnxPredictor(exported)
    answers = []
    for index, data in enumerate(images):
        image, scale, orig_hw = preprocess_image(data, predictor.image_size)
        output = predictor([torch.from_numpy(image)])[0]
        answers.append(
            coco_results(
                output,
                scale=scale,
                orig_hw=orig_hw,
                label_map=predictor.metadata.label_map,
                score_threshold=score_threshold,
                image_id=index,
            )
        )
    return answers


def assert_same_results(got: list[list[dict]], want: list[list[dict]]) -> int:
    """Served results equal in-process ones; returns the number of detections."""
    assert len(got) == len(want)
    total = 0
    for index, (got_image, want_image) in enumerate(zip(got, want, strict=True)):
        assert len(got_image) == len(want_image)
        total += len(got_image)
        for g, w in zip(got_image, want_image, strict=True):
            assert g["image_id"] == index
            assert g["category_id"] == w["category_id"]
            assert g["category_name"] in {"circle", "square", "triangle"}
            np.testing.assert_allclose(g["bbox"], w["bbox"], atol=1e-3)
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)
            assert g["segmentation"] == w["segmentation"]
            decoded = mask_util.decode(g["segmentation"])
            assert list(decoded.shape) == w["segmentation"]["size"]
    return total


def test_repository_layout(server: TritonServer):
    repo = server.repository
    names = EnsembleNames(NAME)
    for model in names.load_order:
        assert (repo / model / "config.pbtxt").is_file()
        assert (repo / model / "1").is_dir()
    assert (repo / names.net / "1" / "model.onnx").is_file()
    assert (repo / NAME / "label_map.json").is_file()
    assert triton.is_ready(server.http_url, NAME)


def test_infer_returns_coco_results_matching_in_process(
    server, exported, val_images, resized_image
):
    images = [*val_images, resized_image]
    answers = triton.infer_images(server.http_url, NAME, images, score_threshold=0.05)
    total = assert_same_results(answers, in_process(exported, images, 0.05))
    assert total > 0, "the tiny model detected nothing at 0.05 on 3 images"
    assert answers[-1] and answers[-1][0]["segmentation"]["size"] == [197, 301]


def test_concurrent_requests_run_as_one_batch_with_the_same_detections(
    server, val_images, resized_image
):
    """Eight single-image requests at once (the export's max_batch_size is 4): the network
    runs them in batches of several images, and every image gets what it gets alone."""
    images = [*val_images, resized_image] * 2
    alone = [triton.infer_images(server.http_url, NAME, [image])[0] for image in images]
    # Triton's statistics once they count the answers received (they can lag them).
    statistics = load_bench_module("gpu_serving").settled_statistics
    before = statistics(server.http_url, NAME)
    together = triton.infer_images(server.http_url, NAME, images)
    after = statistics(server.http_url, NAME, since=before, requests=len(images))
    net = EnsembleNames(NAME).net
    assert after[net]["inferences"] - before[net]["inferences"] == len(images)
    runs = after[net]["executions"] - before[net]["executions"]
    assert runs < len(images), "no two requests shared a network run"
    assert sum(len(want) for want in alone) > 0
    for got, want in zip(together, alone, strict=True):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert (g["category_id"], g["segmentation"]) == (w["category_id"], w["segmentation"])
            np.testing.assert_allclose(g["bbox"], w["bbox"], atol=1e-3)
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)


def test_score_threshold_filters(server, val_images):
    everything = triton.infer_images(server.http_url, NAME, val_images[:1], score_threshold=0.0)
    confident = triton.infer_images(server.http_url, NAME, val_images[:1], score_threshold=0.5)
    assert all(d["score"] >= 0.5 for d in confident[0])
    assert len(confident[0]) <= len(everything[0])


def test_errors_are_typed(server, val_images):
    with pytest.raises(triton.InvalidImage, match="image 1"):
        triton.infer_images(server.http_url, NAME, [val_images[0], b"not an image"])
    gif = io.BytesIO()
    Image.new("RGB", (8, 8)).save(gif, format="GIF")
    with pytest.raises(triton.InvalidImage, match=r"image 0: .*GIF images are not supported"):
        triton.infer_images(server.http_url, NAME, [gif.getvalue()])
    with pytest.raises(triton.ModelNotFound):
        triton.infer_images(server.http_url, "no_such_model", val_images[:1])
    with pytest.raises(triton.TritonUnavailable):
        triton.infer_images(f"127.0.0.1:{free_port()}", NAME, val_images[:1])
    assert not triton.is_ready(f"127.0.0.1:{free_port()}")


def _stub_pid(server: TritonServer, model: str) -> int:
    """The python-backend stub process running ``model`` in ``server``'s process group."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        pid = int(cmdline.parent.name)
        try:
            if os.getpgid(pid) != server.pid:
                continue
            args = cmdline.read_bytes()
        except OSError:  # gone meanwhile
            continue
        if b"triton_python_backend_stub" in args and f"/{model}/".encode() in args:
            return pid
    raise LookupError(f"no python backend stub runs {model}")


def test_large_images_keep_the_preprocess_process_small(server, val_images):
    """17 MP (about 120 MB decoded in full) for a 128 px model: decoded at 1/8 (the parity
    tests compare it with the full decode). score_threshold 1 keeps the postprocess from
    pasting masks into 17 MP."""
    big = large_jpeg(4800, 3600, seed=3)
    stub = _stub_pid(server, EnsembleNames(NAME).preprocess)
    triton.infer_images(server.http_url, NAME, val_images[:1])  # warm: the first call allocates
    with PeakRss(stub) as preprocess:
        answers = triton.infer_images(server.http_url, NAME, [big], score_threshold=1.0)
    assert answers == [[]]
    assert preprocess.grew_mb < 30, preprocess.grew_mb


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


def test_models_named_like_another_models_parts(server, exported, val_images):
    """Publishing ``shapes_net`` & co. leaves ``shapes`` intact: both serve correctly."""
    url = server.http_url
    others = [f"{NAME}_net", f"{NAME}_preprocess", f"{NAME}_postprocess"]
    for other in others:
        assert publish(exported, server.repository, other) == 1
        triton.roll_out(url, other)
    triton.roll_out(url, NAME)  # reloads shapes' parts: they must still be shapes'
    want = in_process(exported, val_images[:2], 0.05)
    for model in [NAME, *others]:
        got = triton.infer_images(url, model, val_images[:2], score_threshold=0.05)
        assert_same_results(got, want)
    for other in others:
        triton.retire(url, other)
        assert not triton.is_ready(url, other)
    assert triton.is_ready(url, NAME)
