"""The workflow over HTTP with a real worker: register + convert a dataset, train, follow
progress/metrics/logs, download the checkpoint; cancel a running training job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pycocotools.mask as mask_util
import pytest

from maskops.export.options import DEFAULTS, export_file_name
from maskops_core.settings import Settings
from tests.integration.api.conftest import Worker, api_with_tritons, wait_for
from tests.support.bench import load_bench_module

pytestmark = pytest.mark.integration

# tiny_spec's FPN levels, anchors, heads and sampling sizes (bench/synthetic.py's
# TINY_HEADS) with 64 RoIs an image: TAO's (levels 2-6, a 1024-wide box head, 28x28 masks)
# made each step 4x slower on a CPU.
TINY_HEADS_TEXT = "".join(
    f"  {field}: {value}\n"
    for field, value in {
        **load_bench_module("synthetic").TINY_HEADS,
        "batch_size_per_im": 64,
    }.items()
)
TRAIN_SPEC = (
    """\
# A tiny TAO-style spec: resnet10 at 128 px, a few steps on CPU.
seed: 7
init_learning_rate: 0.005
warmup_steps: 0
total_steps: {steps}
train_batch_size: 2
eval_batch_size: 2
num_steps_per_eval: {every}
data_config {{
  image_size: "(128, 128)"
  augment_input_data: False
  eval_samples: 2
  num_classes: 4
  n_workers: 1
  max_num_instances: 20
}}
maskrcnn_config {{
  arch: "resnet"
  nlayers: 10
"""
    + TINY_HEADS_TEXT
    + "}}\n"
)


def register_demo(client: httpx.Client, demo_root: str, worker: Worker | None = None) -> int:
    response = client.post(
        "/datasets",
        json={
            "name": "demo",
            "train": {
                "image_dir": f"{demo_root}/images/train",
                "annotation_file": f"{demo_root}/annotations/train.json",
            },
            "val": {
                "image_dir": f"{demo_root}/images/val",
                "annotation_file": f"{demo_root}/annotations/val.json",
            },
            "num_shards": 2,
        },
    )
    assert response.status_code == 201, response.text
    dataset = response.json()
    wait_for(client, dataset["convert_job_id"], {"succeeded", "failed"}, worker=worker)
    return int(dataset["id"])


def create_experiment(
    client: httpx.Client, dataset_id: int, *, steps: int, every: int, top: str = ""
) -> int:
    """An experiment of TRAIN_SPEC; ``top`` adds top-level spec lines."""
    response = client.post(
        "/experiments",
        json={
            "name": "demo-r10",
            "dataset_id": dataset_id,
            "spec_text": top + TRAIN_SPEC.format(steps=steps, every=every),
        },
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


@dataclass
class Stack:
    """The API as its image runs it, a real Triton behind it, and their settings."""

    client: httpx.Client
    settings: Settings


@pytest.fixture
def stack(
    clean_db: Settings, tmp_path: Path, api_extra_python: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    """The API from a virtualenv with only the ``api`` extra (no torch, no onnx) serving
    /models and /infer through a real Triton (the PyPI server) whose python models can
    import only what the ``triton`` extra installs."""
    with api_with_tritons(clean_db, tmp_path, api_extra_python, monkeypatch, 1) as started:
        client, settings, _ = started
        yield Stack(client, settings)


def test_whole_workflow_over_http(
    stack: Stack, workers: Callable[..., Worker], demo_root: str, clean_db: Settings
) -> None:
    client = stack.client
    worker = workers("w1", stack.settings)
    dataset_id = register_demo(client, demo_root, worker)
    dataset = client.get(f"/datasets/{dataset_id}").json()
    assert dataset["status"] == "succeeded", client.get(
        f"/jobs/{dataset['convert_job_id']}/logs"
    ).text
    assert dataset["counts"]["train"]["images"] == 16 and dataset["counts"]["val"]["images"] == 4
    assert [c["name"] for c in dataset["label_map"]] == ["circle", "square", "triangle"]
    assert {w["split"] for w in dataset["warnings"]} == {"train", "val"}

    # TAO's report_frequency: progress and metrics reach the job every 2 steps, although
    # training logs metrics every step.
    top = "report_frequency: 2\nlogging_frequency: 1\n"
    experiment_id = create_experiment(client, dataset_id, steps=4, every=2, top=top)
    submitted = client.post("/jobs", json={"action": "train", "experiment_id": experiment_id})
    assert submitted.status_code == 202, submitted.text
    job = wait_for(client, submitted.json()["id"], {"succeeded", "failed"}, worker=worker)
    assert job["status"] == "succeeded", (job, client.get(f"/jobs/{job['id']}/logs").text)
    assert job["progress"]["step"] == job["progress"]["total"] == 4
    assert job["attempts"] == 1 and job["result"]["checkpoint"].endswith("model.step-4.pth")
    assert "Total loss" in job["latest_metrics"]

    metrics = client.get(f"/jobs/{job['id']}/metrics").json()
    losses = [m for m in metrics if "Total loss" in m["values"]]
    assert losses and all(m["values"]["Total loss"] > 0 for m in losses)
    assert [m["step"] for m in metrics] == [2, 4]
    # Each evaluation's validation loss is reported beside its AP.
    assert all(m["values"]["val/Total loss"] > 0 and "mask_AP" in m["values"] for m in metrics)
    logs = client.get(f"/jobs/{job['id']}/logs").text
    assert "attempt 1: train started" in logs and "attempt 1: succeeded" in logs
    assert "Total loss" in logs
    tail = client.get(f"/jobs/{job['id']}/logs", params={"offset": len(logs.encode()) - 10})
    assert tail.text == logs[-10:]

    artifacts = {a["path"]: a["size"] for a in client.get(f"/jobs/{job['id']}/artifacts").json()}
    assert "results/model.step-4.pth" in artifacts
    download = client.get(f"/jobs/{job['id']}/artifacts/results/model.step-4.pth")
    assert (
        download.status_code == 200
        and len(download.content) == artifacts["results/model.step-4.pth"]
    )
    assert client.get(f"/jobs/{job['id']}/artifacts/../../../etc/passwd").status_code == 404

    def follow_up(action: str, parent: int, **options: object) -> dict[str, Any]:
        body = {"action": action, "parent_job_id": parent, "options": options}
        submitted = client.post("/jobs", json=body)
        assert submitted.status_code == 202, submitted.text
        done = wait_for(client, submitted.json()["id"], {"succeeded", "failed"}, worker=worker)
        assert done["status"] == "succeeded", client.get(f"/jobs/{done['id']}/logs").text
        return done

    evaluation = follow_up("evaluate", job["id"])
    # Predictions for review in labelling tools, downloadable as the job's artifacts.
    review = follow_up("inference", job["id"], threshold=0.0, exports=["labelstudio", "cvat"])
    exports = sorted(Path(p).name for p in review["result"]["exports"])
    assert exports == [
        "labelstudio_config.xml",
        "predictions_cvat.xml",
        "predictions_labelstudio.json",
    ]
    tasks = client.get(f"/jobs/{review['id']}/artifacts/exports/predictions_labelstudio.json")
    assert len(tasks.json()) == 4
    assert {t["predictions"][0]["model_version"] for t in tasks.json()} == {f"job-{job['id']}"}
    assert {"AP", "mask_AP"} <= set(evaluation["result"]["metrics"])
    best = follow_up("evaluate", job["id"], checkpoint="best")  # TAO's checkpoint_choose_method
    assert best["result"]["model"].endswith("results/model.best.pth")
    assert (clean_db.data_root / evaluation["result"]["report"]).is_file()
    pruned = follow_up("prune", job["id"], threshold=0.7)
    assert pruned["result"]["params_after"] <= pruned["result"]["params_before"]
    # A spec sent over REST names the pruned model relative to the data root.
    pruned_experiment = create_experiment(
        client,
        dataset_id,
        steps=2,
        every=2,
        top=f'pruned_model_path: "{pruned["result"]["model"]}"\n',
    )
    retrained = client.post("/jobs", json={"action": "train", "experiment_id": pruned_experiment})
    done = wait_for(client, retrained.json()["id"], {"succeeded", "failed"}, worker=worker)
    assert done["status"] == "succeeded", client.get(f"/jobs/{done['id']}/logs").text
    assert done["result"]["checkpoint"].endswith("model.step-2.pth")
    exported = follow_up("export", pruned["id"])
    # Named as `maskops export` names its default output: after the model exported.
    onnx_name = export_file_name(Path(pruned["result"]["model"]), DEFAULTS.data_type)
    assert exported["result"]["onnx"] == f"jobs/{exported['id']}/export/{onnx_name}"

    published = client.post("/models/shapes/publish", json={"job_id": exported["id"]})
    assert published.status_code == 202, published.text
    publish_job = wait_for(client, published.json()["id"], {"succeeded", "failed"}, worker=worker)
    assert publish_job["status"] == "succeeded", client.get(f"/jobs/{publish_job['id']}/logs").text
    assert publish_job["result"] == {
        "name": "shapes",
        "version": 1,
        "served": True,
        "note": "",
        "replicas": {stack.settings.triton_url: "serves version 1"},
    }
    versions = client.get("/models/shapes").json()
    assert [(v["version"], v["published"], v["job_id"]) for v in versions] == [
        (1, True, exported["id"])
    ]
    image = sorted((clean_db.data_root / demo_root / "images" / "val").glob("*.jpg"))[0]
    answer = client.post(
        "/infer",
        params={"model": "shapes"},
        files=[("images", (image.name, image.read_bytes(), "image/jpeg"))],
    )
    assert answer.status_code == 200, answer.text
    for detection in answer.json():
        assert detection["image_id"] == 0 and detection["category_id"] in {1, 3, 7}
        assert len(detection["bbox"]) == 4 and detection["segmentation"]["size"] == [128, 128]
    outlined = client.post(
        "/infer",
        params={"model": "shapes", "mask_format": "polygon"},
        files=[("images", (image.name, image.read_bytes(), "image/jpeg"))],
    )
    assert outlined.status_code == 200, outlined.text
    for rle_answer, polygon_answer in zip(answer.json(), outlined.json(), strict=True):
        rle = rle_answer["segmentation"]
        rle = {"size": rle["size"], "counts": rle["counts"].encode()}
        if not polygon_answer["segmentation"]:  # a speck has no outline of 3 points
            assert mask_util.area(rle) <= 4
            continue
        drawn = mask_util.frPyObjects(polygon_answer["segmentation"], 128, 128)
        # 0.9, not the 0.95 of clean masks: this barely trained model's masks are ragged.
        assert mask_util.iou([rle], [mask_util.merge(drawn)], [0])[0][0] >= 0.9
    bad = client.post(
        "/infer", params={"model": "shapes"}, files=[("images", ("x.jpg", b"nope", "image/jpeg"))]
    )
    assert bad.status_code == 415 and "image 0" in bad.json()["detail"]
    missing = client.post(
        "/infer", params={"model": "nope"}, files=[("images", (image.name, image.read_bytes()))]
    )
    assert missing.status_code == 404

    # A version Triton cannot load (a backend this Triton lacks) is undone: the job says
    # why, the repository and the model list are as before, version 1 keeps answering.
    repository = stack.settings.model_repository
    before = sorted(str(p.relative_to(repository)) for p in repository.rglob("*"))
    worker.stop()
    onnxruntime_backend = stack.settings.model_copy(update={"triton_net_backend": "onnxruntime"})
    worker = workers("w2", onnxruntime_backend)
    again = client.post("/models/shapes/publish", json={"job_id": exported["id"]})
    failed = wait_for(client, again.json()["id"], {"succeeded", "failed"}, worker=worker)
    assert failed["status"] == "failed", client.get(f"/jobs/{failed['id']}/logs").text
    assert "Triton did not load shapes version 2" in failed["error"], failed["error"]
    assert "Version 1 serves again" in failed["error"], failed["error"]
    assert sorted(str(p.relative_to(repository)) for p in repository.rglob("*")) == before
    assert [v["version"] for v in client.get("/models/shapes").json()] == [1]
    still = client.post(
        "/infer", params={"model": "shapes"}, files=[("images", (image.name, image.read_bytes()))]
    )
    assert still.status_code == 200 and still.json() == answer.json()
