from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "specs"
TAO_SAMPLES = sorted(FIXTURES.glob("tao_*.txt"))
"""NVIDIA's published TAO mask_rcnn sample specs, reproduced verbatim."""


@pytest.fixture(params=TAO_SAMPLES, ids=[p.stem for p in TAO_SAMPLES])
def tao_sample(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path
