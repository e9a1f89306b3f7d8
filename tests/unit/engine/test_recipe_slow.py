"""The demo walk's full recipe learns the demo shapes (not in CI: ``-m slow``).

    .venv/bin/pytest -m slow tests/unit/engine/test_recipe_slow.py

What ``maskops serve --demo`` trains (``maskops_api.demo``: its dataset, spec and
``DEMO_STEPS``), evaluated at the end on the walk's 40 validation images: about six minutes
on an otherwise idle 2-core CPU. CI trains the same recipe for fewer steps (the
``trained_model`` fixture); bench/demo_recipe.py records the whole curve.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from maskops.data.convert import convert_dataset
from maskops.engine import run_training
from maskops.spec.text import parse_spec_text
from maskops_api.demo import DEMO_STEPS, demo_spec_text, generate_walk_dataset

WALK_MASK_AP = 0.4
"""What the walk's printout shows a newcomer, with a margin for the run-to-run spread."""


@pytest.mark.slow
def test_the_demo_walk_recipe_reaches_its_mask_ap(tmp_path: Path) -> None:
    demo = generate_walk_dataset(tmp_path / "demo")
    convert_dataset(demo.train_images, demo.train_json, tmp_path / "shards", workers=1)
    convert_dataset(demo.val_images, demo.val_json, tmp_path / "shards", workers=1)
    spec = parse_spec_text(
        demo_spec_text(DEMO_STEPS, shards=tmp_path / "shards", val_json=demo.val_json)
    )

    result = run_training(spec, tmp_path / "run")

    assert float(result.metrics["mask_AP"]) >= WALK_MASK_AP, result.metrics
