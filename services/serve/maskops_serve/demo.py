"""The demo workflow over HTTP, as a user would drive it: register the demo dataset,
convert, train a short run, evaluate, prune, export, publish, infer; printing each step."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from maskops.data.demo import DemoDataset
    from maskops.spec.models import ExperimentSpec

DEMO_DATA_VERSION = "3"
"""Raise with any change to the walk's data: a stack started before regenerates it and
registers it anew."""
DEMO_IMAGES = 200
DEMO_IMAGE_SIZE = (128, 128)
DEMO_STEPS = 1200
"""About four minutes of training on two CPU cores: mask AP about 0.7 on the walk's
validation images, none of their shapes labelled twice (bench/demo_recipe.py records the
curve, docs/benchmarks.md the runs)."""

_DEMO_SPEC = """\
# maskops demo recipe: resnet10 from scratch on 128 px shapes, CPU-sized.
# bench/demo_recipe.py records its curve: mask AP about 0.7 within four minutes of
# training on two CPU cores (docs/benchmarks.md). bf16 where the CPU runs it natively
# (elsewhere use_amp is declined with a notice).
seed: 1
use_amp: True
init_learning_rate: 0.02
warmup_learning_rate: 0.002
warmup_steps: 50
learning_rate_steps: "[{decay}]"
learning_rate_decay_levels: "[0.1]"
total_steps: {steps}
train_batch_size: 4
eval_batch_size: 8
num_steps_per_eval: {steps}
data_config {{{data_paths}
  image_size: "(128, 128)"
  augment_input_data: True
  num_classes: 4
  n_workers: 1
  max_num_instances: 20
}}
maskrcnn_config {{
  arch: "resnet"
  nlayers: 10
  # FPN levels 3-5 with anchors of 16-90 px: the demo shapes' sizes; square anchors only.
  min_level: 3
  max_level: 5
  anchor_scale: 2.0
  num_scales: 2
  aspect_ratios: "[(1.0, 1.0)]"
  rpn_batch_size_per_im: 64
  batch_size_per_im: 32
  fast_rcnn_mlp_head_dim: 128
  gt_mask_size: 28
  mrcnn_resolution: 16
  train_rpn_pre_nms_topn: 200
  train_rpn_post_nms_topn: 100
  test_rpn_pre_nms_topn: 100
  test_rpn_post_nms_topn: 50
  test_detections_per_image: 20
}}
"""


def demo_spec_text(
    steps: int = DEMO_STEPS, *, shards: Path | None = None, val_json: Path | None = None
) -> str:
    """The walk's experiment spec (TAO text format) for a run of ``steps`` steps.

    The learning rate drops tenfold at 80% of the run (the largest gain of the run comes
    right after it; earlier, the model has not learned enough to refine). Over HTTP the
    API fills in the dataset's paths; elsewhere (tests, bench/demo_recipe.py) pass
    ``shards`` (where dataset_convert wrote ``train-*``/``val-*``) and ``val_json``.
    """
    data_paths = ""
    if shards is not None and val_json is not None:
        data_paths = (
            f'\n  training_file_pattern: "{shards}/train*"'
            f'\n  validation_file_pattern: "{shards}/val*"'
            f'\n  val_json_file: "{val_json}"'
        )
    return _DEMO_SPEC.format(steps=steps, decay=round(steps * 0.8), data_paths=data_paths)


def generate_walk_dataset(root: Path) -> DemoDataset:
    """Write the walk's demo dataset (fewer, larger shapes than the tests') under ``root``."""
    # The engine is imported here only: the API service alone does not install it.
    from maskops.data.demo import DEMO_WALK_LAYOUT, generate_demo_dataset

    return generate_demo_dataset(
        root, num_images=DEMO_IMAGES, image_size=DEMO_IMAGE_SIZE, seed=0, layout=DEMO_WALK_LAYOUT
    )


@dataclass(frozen=True)
class WalkTraining:
    """The walk's dataset, converted, and the spec that trains on it."""

    dataset: DemoDataset
    spec: ExperimentSpec


def prepare_walk_training(root: Path, steps: int = DEMO_STEPS) -> WalkTraining:
    """Generate and convert the walk's dataset under ``root`` (``demo/``, ``shards/``).

    What the walk does over HTTP, in process: for the ``trained_model`` test fixture, the
    slow recipe test and bench/demo_recipe.py, which then call ``run_training``.
    """
    from maskops.data.convert import convert_dataset
    from maskops.spec.text import parse_spec_text

    dataset = generate_walk_dataset(root / "demo")
    for images, coco_json in (
        (dataset.train_images, dataset.train_json),
        (dataset.val_images, dataset.val_json),
    ):
        convert_dataset(images, coco_json, root / "shards", workers=1)
    text = demo_spec_text(steps, shards=root / "shards", val_json=dataset.val_json)
    return WalkTraining(dataset, parse_spec_text(text))


Say = Callable[[str], None]

DEMO_PRUNE_THRESHOLD = 0.94

SLOW_CALL_S = 600.0
"""Publishing (Triton loads the model) and the first inference can take minutes on a CPU."""


DEMO_PICTURE = "demo-detections.png"
PICTURE_SIDE = 512
SHOWN_SCORE = 0.5
"""Detections at or above this score are listed (the best one is, whatever its score)."""


TWICE_IOU = 0.5
"""Two listed detections of different classes whose masks overlap by more than this
(intersection over union) are one shape given two labels."""


class DemoError(Exception):
    pass


def walk_picture(val_images: Path) -> Path:
    """The image the walk sends to ``/infer`` and draws: the first of the validation split."""
    return sorted(val_images.glob("*.jpg"))[0]


def labelled_twice(detections: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The shapes given two labels: each pair of listed detections (score at or above
    ``SHOWN_SCORE``) of different categories whose RLE masks overlap by more than
    ``TWICE_IOU``, as ``("square 0.97", "triangle 0.58")``, best first."""
    import pycocotools.mask as mask_util

    shown = sorted((d for d in detections if d["score"] >= SHOWN_SCORE), key=lambda d: -d["score"])
    pairs = []
    for i, first in enumerate(shown):
        for second in shown[i + 1 :]:
            if first["category_id"] == second["category_id"]:
                continue
            iou = mask_util.iou([first["segmentation"]], [second["segmentation"]], [0])
            if float(iou[0][0]) > TWICE_IOU:
                pairs.append((_label(first), _label(second)))
    return pairs


def _label(detection: dict[str, Any]) -> str:
    name = detection.get("category_name") or detection["category_id"]
    return f"{name} {detection['score']:.2f}"


def describe_detections(detections: list[dict[str, Any]]) -> str:
    """``"3 detections: circle 0.98, square 0.91, ..."``: by category name, best first."""
    ranked = sorted(detections, key=lambda d: d["score"], reverse=True)
    shown = [d for d in ranked if d["score"] >= SHOWN_SCORE] or ranked[:1]
    listed = ", ".join(_label(d) for d in shown)
    hidden = len(ranked) - len(shown)
    more = f" (and {hidden} below {SHOWN_SCORE})" if hidden else ""
    plural = "" if len(ranked) == 1 else "s"
    return f"{len(ranked)} detection{plural}" + (f": {listed}{more}" if ranked else "")


def draw_demo_detections(image: Path, detections: list[dict[str, Any]], out: Path) -> Path:
    """Draw the listed detections' masks, boxes and labels over ``image`` into ``out``,
    enlarged to about ``PICTURE_SIDE`` pixels so that the labels stay legible."""
    # The embedded stack runs with the engine installed; the API service alone does not
    # need Pillow or pycocotools, so they are imported only here.
    import numpy as np
    import pycocotools.mask as mask_util
    from PIL import Image

    from maskops.evaluation.visualize import draw_detections

    with Image.open(image) as original:
        scale = max(1, PICTURE_SIDE // max(original.size))
        enlarged = original.convert("RGB").resize(
            (original.width * scale, original.height * scale), Image.Resampling.BICUBIC
        )
    shown = []
    for det in (d for d in detections if d["score"] >= SHOWN_SCORE):
        mask = mask_util.decode(det["segmentation"]).repeat(scale, 0).repeat(scale, 1)
        rle = mask_util.encode(np.asfortranarray(mask))
        box = [v * scale for v in det["bbox"]]
        shown.append({**det, "bbox": box, "segmentation": rle})
    names = {int(d["category_id"]): str(d.get("category_name", d["category_id"])) for d in shown}
    drawn = draw_detections(enlarged, shown, category_names=names, include_mask=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    drawn.save(out)
    return out


def _check(response: httpx.Response, what: str) -> dict[str, Any]:
    if response.status_code >= 400:
        raise DemoError(f"{what}: HTTP {response.status_code}: {response.text[:300]}")
    body: dict[str, Any] = response.json()
    return body


def register_demo_dataset(base_url: str, *, token: str | None = None, say: Say = print) -> int:
    """Register ``demo/`` under the data root (idempotent: the same dataset every start)."""
    with _client(base_url, token) as client:
        body = {
            "name": "demo-shapes",
            "train": {
                "image_dir": "demo/images/train",
                "annotation_file": "demo/annotations/train.json",
            },
            "val": {"image_dir": "demo/images/val", "annotation_file": "demo/annotations/val.json"},
            "num_shards": 2,
        }
        dataset = _check(
            client.post(
                "/datasets",
                json=body,
                headers={"Idempotency-Key": f"embedded-demo-{DEMO_DATA_VERSION}"},
            ),
            "register demo dataset",
        )
    say(
        f"dataset {dataset['id']} 'demo-shapes' registered"
        f" (convert job {dataset['convert_job_id']})"
    )
    return int(dataset["id"])


def _client(base_url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base_url, headers=headers, timeout=30)


def wait_job(
    client: httpx.Client, job_id: int, say: Say, *, timeout: float = 3600
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        job = _check(client.get(f"/jobs/{job_id}"), f"job {job_id}")
        progress = job["progress"]
        line = f"  {job['action']} job {job_id}: {job['status']}"
        if progress["step"] is not None and progress["total"]:
            line += f" step {progress['step']}/{progress['total']}"
        loss = (job["latest_metrics"] or {}).get("Total loss")
        if loss is not None:
            line += f" loss {loss:.3f}"
        if line != last:
            # ETA is printed with a change of step, not on every poll.
            eta = progress["eta_seconds"]
            say(line + (f" ETA {eta:.0f}s" if eta is not None else ""))
            last = line
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(1.0)
    raise DemoError(f"job {job_id} did not finish within {timeout:.0f}s")


def _job(client: httpx.Client, say: Say, body: dict[str, Any]) -> dict[str, Any]:
    submitted = _check(client.post("/jobs", json=body), f"submit {body['action']}")
    job = wait_job(client, submitted["id"], say)
    if job["status"] != "succeeded":
        raise DemoError(f"{body['action']} job {job['id']} {job['status']}: {job['error']}")
    return job


def run_demo(
    base_url: str,
    dataset_id: int,
    *,
    data_root: Path,
    out_dir: Path,
    token: str | None = None,
    steps: int = DEMO_STEPS,
    say: Say = print,
) -> int:
    """Walk the workflow; returns 0 when every step succeeded.

    Prints each step; the last one sends a validation image to ``/infer``, prints what
    was found by category name and score, and draws the masks into ``out_dir``.
    """
    with _client(base_url, token) as client:
        _converted(client, dataset_id, say)
        train = _trained(client, dataset_id, steps, say)
        _evaluated(client, train, say)
        _pruned(client, train, say)
        say("6. export")
        export = _job(client, say, {"action": "export", "parent_job_id": train["id"]})
        say(f"   exported {export['result']['onnx']}")
        _published(client, export, say)
        _inferred(client, data_root, out_dir, say)
        say(f"Swagger UI: {base_url}/docs   dashboard: {base_url}/ui")
        return 0


def _converted(client: httpx.Client, dataset_id: int, say: Say) -> None:
    dataset = _check(client.get(f"/datasets/{dataset_id}"), "dataset")
    say("1. dataset_convert")
    convert = wait_job(client, dataset["convert_job_id"], say)
    if convert["status"] != "succeeded":
        raise DemoError(f"conversion failed: {convert['error']}")
    dataset = _check(client.get(f"/datasets/{dataset_id}"), "dataset")
    counts = {k: v["images"] for k, v in dataset["counts"].items()}
    say(f"   images per split {counts}, classes {[c['name'] for c in dataset['label_map']]}")


def _trained(client: httpx.Client, dataset_id: int, steps: int, say: Say) -> dict[str, Any]:
    say("2. experiment from a TAO text spec")
    body = {"name": "demo-r10", "dataset_id": dataset_id, "spec_text": demo_spec_text(steps)}
    experiment = _check(client.post("/experiments", json=body), "create experiment")
    say(f"   experiment {experiment['id']} version {experiment['version']}")
    say(f"3. train ({steps} steps)")
    train = _job(client, say, {"action": "train", "experiment_id": experiment["id"]})
    say(f"   checkpoint {train['result']['checkpoint']}")
    return train


def _evaluated(client: httpx.Client, train: dict[str, Any], say: Say) -> None:
    say("4. evaluate")
    evaluation = _job(client, say, {"action": "evaluate", "parent_job_id": train["id"]})
    metrics = evaluation["result"]["metrics"]
    say(
        f"   AP {metrics.get('AP', float('nan')):.4f}"
        f"  mask_AP {metrics.get('mask_AP', float('nan')):.4f}"
    )


def _pruned(client: httpx.Client, train: dict[str, Any], say: Say) -> None:
    # A short run from scratch keeps its filter norms within about 0.8..1 of each layer's
    # largest: a threshold under that band would cut nothing (README, Pruning and
    # retraining).
    say(f"5. prune (threshold {DEMO_PRUNE_THRESHOLD})")
    options = {"threshold": DEMO_PRUNE_THRESHOLD}
    body = {"action": "prune", "parent_job_id": train["id"], "options": options}
    report = _job(client, say, body)["result"]
    say(
        f"   parameters {report['params_before']} -> {report['params_after']},"
        f" GMACs {report['macs_before'] / 1e9:.2f} -> {report['macs_after'] / 1e9:.2f}"
    )


def _published(client: httpx.Client, export: dict[str, Any], say: Say) -> None:
    # A job: a worker writes the version into the model repository and Triton loads it
    # (tens of seconds on a CPU).
    say("7. publish")
    submitted = _check(
        client.post("/models/demo/publish", json={"job_id": export["id"]}), "publish"
    )
    publish = wait_job(client, submitted["id"], say)
    if publish["status"] != "succeeded":
        raise DemoError(f"publish job {publish['id']} {publish['status']}: {publish['error']}")
    say(f"   model demo version {publish['result']['version']} published")


def _inferred(client: httpx.Client, data_root: Path, out_dir: Path, say: Say) -> None:
    say("8. infer")
    image = walk_picture(data_root / "demo" / "images" / "val")
    results = client.post(
        "/infer",
        params={"model": "demo"},
        files=[("images", (image.name, image.read_bytes(), "image/jpeg"))],
        timeout=SLOW_CALL_S,
    )
    if results.status_code >= 400:
        raise DemoError(f"infer: HTTP {results.status_code}: {results.text[:300]}")
    detections = results.json()
    say(f"   {image.name}: {describe_detections(detections)}")
    for first, second in labelled_twice(detections):
        say(f"   one shape labelled twice: {first} and {second}")
    drawn = draw_demo_detections(image, detections, out_dir / DEMO_PICTURE)
    say(f"   masks drawn on the image: {drawn}")
