"""The demo walk's full recipe learns the demo shapes (not in CI: ``-m slow``).

    .venv/bin/pytest -m slow tests/unit/training/test_recipe_slow.py

What ``maskops serve --demo`` trains (``maskops_serve.demo``: its dataset, spec and
``DEMO_STEPS``), evaluated at the end on the walk's 40 validation images: about five
minutes on an otherwise idle 2-core CPU. CI trains the same recipe for fewer steps (the
``trained_model`` fixture); bench/demo_recipe.py records the whole curve.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from maskops.training import run_training
from maskops_serve.demo import prepare_walk_training

WALK_MASK_AP = 0.45
"""What the walk's printout shows a newcomer, with a margin for the run-to-run spread."""


@pytest.mark.slow
def test_the_demo_walk_recipe_reaches_its_mask_ap(tmp_path: Path) -> None:
    spec = prepare_walk_training(tmp_path).spec

    result = run_training(spec, tmp_path / "run")

    assert float(result.metrics["mask_AP"]) >= WALK_MASK_AP, result.metrics
