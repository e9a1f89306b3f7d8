"""Images without objects: kept as training negatives and counted, or dropped as TAO does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from maskops.cli.main import main
from maskops.data.convert import convert_dataset
from maskops.data.manifest import Manifest
from maskops.data.pipeline import build_train_loader
from maskops.data.shards import iter_shard
from maskops.modeling import build_model
from maskops.spec.models import ExperimentSpec


def _without_objects(demo: Any, out: Path, emptied: int) -> tuple[Path, set[int]]:
    """The demo train JSON with every annotation of its first ``emptied`` images removed."""
    coco = json.loads(Path(demo.train_json).read_text())
    empty = {image["id"] for image in coco["images"][:emptied]}
    coco["annotations"] = [a for a in coco["annotations"] if a["image_id"] not in empty]
    path = out / "train.json"
    path.write_text(json.dumps(coco))
    return path, empty


def _image_ids(manifest: Manifest) -> dict[int, int]:
    """image id -> number of objects, over every shard of the manifest."""
    return {
        s.record["image_id"]: len(s.record["annotations"])
        for path in manifest.shard_paths()
        for s in iter_shard(path)
    }


def test_images_without_objects_are_kept_as_counted_negatives(
    demo_dataset: Any, tmp_path: Path, tiny_spec: ExperimentSpec
) -> None:
    annotations, empty = _without_objects(demo_dataset, tmp_path, emptied=3)
    result = convert_dataset(demo_dataset.train_images, annotations, tmp_path / "out", workers=1)

    manifest = Manifest.load(result.manifest_path)
    objects = _image_ids(manifest)
    assert {i for i, n in objects.items() if n == 0} == empty
    assert manifest.num_images == 24 and manifest.num_images_without_objects == 3
    assert manifest.data["num_dropped_empty_images"] == 0
    assert "24 written, 0 skipped; 3 without objects (negatives)" in result.summary()

    # The training stream serves them, and a training step on one is a finite loss.
    data = tiny_spec.data_config.model_copy(
        update={"training_file_pattern": str(result.shards[0]), "augment_input_data": False}
    )
    spec = tiny_spec.model_copy(update={"data_config": data, "train_batch_size": 24})
    images, targets = next(iter(build_train_loader(spec)))
    negatives = [i for i, t in enumerate(targets) if int(t["image_id"]) in empty]
    assert len(negatives) == 3 and all(len(targets[i]["boxes"]) == 0 for i in negatives)
    torch.manual_seed(0)
    model = build_model(spec.maskrcnn_config, num_classes=4, image_size=data.image_size).train()
    losses = model([images[negatives[0]]], [targets[negatives[0]]])
    assert all(torch.isfinite(v) for v in losses.values())


def test_drop_empty_images_flag_leaves_them_out(demo_dataset: Any, tmp_path: Path) -> None:
    annotations, empty = _without_objects(demo_dataset, tmp_path, emptied=3)
    out = tmp_path / "out"
    args = ["-i", str(demo_dataset.train_images), "-a", str(annotations), "-o", str(out)]
    assert main(["dataset_convert", *args, "--workers", "1", "--drop_empty_images"]) == 0

    manifest = Manifest.load(out / "train_manifest.json")
    objects = _image_ids(manifest)
    assert not empty & set(objects) and all(n > 0 for n in objects.values())
    assert manifest.num_images == 21 and manifest.num_images_without_objects == 0
    assert manifest.data["num_dropped_empty_images"] == 3
