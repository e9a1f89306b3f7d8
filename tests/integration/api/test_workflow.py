"""The workflow over HTTP with a real worker: register + convert a dataset, train, follow
progress/metrics/logs, download the checkpoint; cancel a running training job."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from tests.integration.api.conftest import Worker, wait_for

pytestmark = pytest.mark.integration

TRAIN_SPEC = """\
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
  gt_mask_size: 28
  train_rpn_pre_nms_topn: 200
  train_rpn_post_nms_topn: 100
  test_rpn_pre_nms_topn: 100
  test_rpn_post_nms_topn: 50
  batch_size_per_im: 64
  rpn_batch_size_per_im: 64
  test_detections_per_image: 20
}}
"""


def register_demo(client: TestClient, demo_root: str, worker: Worker | None = None) -> int:
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


def create_experiment(client: TestClient, dataset_id: int, *, steps: int, every: int) -> int:
    response = client.post(
        "/experiments",
        json={
            "name": "demo-r10",
            "dataset_id": dataset_id,
            "spec_text": TRAIN_SPEC.format(steps=steps, every=every),
        },
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def test_convert_and_train_end_to_end(
    client: TestClient, workers: Callable[[str], Worker], demo_root: str
) -> None:
    worker = workers("w1")
    dataset_id = register_demo(client, demo_root, worker)
    dataset = client.get(f"/datasets/{dataset_id}").json()
    assert dataset["status"] == "succeeded", client.get(
        f"/jobs/{dataset['convert_job_id']}/logs"
    ).text
    assert dataset["counts"]["train"]["images"] == 16 and dataset["counts"]["val"]["images"] == 4
    assert [c["name"] for c in dataset["label_map"]] == ["circle", "square", "triangle"]
    assert {w["split"] for w in dataset["warnings"]} == {"train", "val"}

    experiment_id = create_experiment(client, dataset_id, steps=4, every=2)
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
