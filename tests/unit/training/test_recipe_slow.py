"""The demo walk's full recipe learns the demo shapes (not in CI: ``-m slow``).

    .venv/bin/pytest -m slow tests/unit/training/test_recipe_slow.py

What ``maskops serve --demo`` trains (``maskops_serve.demo``: its dataset, spec and
``DEMO_STEPS``), evaluated at the end on the walk's 40 validation images: about four
minutes on an otherwise idle 2-core CPU. CI trains the same recipe for fewer steps (the
``trained_model`` fixture); bench/demo_recipe.py records the whole curve.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pycocotools.mask as mask_util
import pytest

from maskops.evaluation.inference import run_inference
from maskops.training import run_training
from maskops_serve.demo import (
    SHOWN_SCORE,
    TWICE_IOU,
    labelled_twice,
    prepare_walk_training,
    walk_picture,
)

WALK_MASK_AP = 0.6
"""What the walk's printout shows a newcomer, with a margin for the run-to-run spread."""


@pytest.mark.slow
def test_the_demo_walk_recipe_reaches_its_mask_ap_and_draws_each_shape_once(
    tmp_path: Path,
) -> None:
    walk = prepare_walk_training(tmp_path)

    result = run_training(walk.spec, tmp_path / "run")

    assert float(result.metrics["mask_AP"]) >= WALK_MASK_AP, result.metrics
    # The walk's picture, as /infer answers for it.
    picture = walk_picture(walk.dataset.val_images)
    images = tmp_path / "picture"
    images.mkdir()
    shutil.copy(picture, images)
    assert result.checkpoint is not None
    labels = tmp_path / "labels"
    run_inference(
        walk.spec, result.checkpoint, images, tmp_path / "drawn", label_dir=labels, progress=False
    )
    detections = json.loads((labels / f"{picture.stem}.json").read_text())
    assert labelled_twice(detections) == []
    truth = json.loads(walk.dataset.val_json.read_text())
    image = next(i for i in truth["images"] if i["file_name"] == picture.name)
    shapes = [a for a in truth["annotations"] if a["image_id"] == image["id"]]
    listed = [d for d in detections if d["score"] >= SHOWN_SCORE]
    assert len(listed) == len(shapes), (listed, shapes)
    for shape in shapes:
        polygons = mask_util.frPyObjects(shape["segmentation"], image["height"], image["width"])
        outline = mask_util.merge(polygons)
        found = [
            d["category_id"]
            for d in listed
            if mask_util.iou([d["segmentation"]], [outline], [0])[0][0] > TWICE_IOU
        ]
        assert found == [shape["category_id"]], (shape, listed)
