from __future__ import annotations

import pytest

from maskops.spec.models import ExperimentSpec
from maskops.training.schedule import LRSchedule


def test_warmup_then_absolute_decay_levels() -> None:
    schedule = LRSchedule(
        init_learning_rate=0.02,
        warmup_learning_rate=0.002,
        warmup_steps=10,
        learning_rate_steps=(20, 30),
        learning_rate_decay_levels=(0.1, 0.02),
    )
    assert schedule(0) == pytest.approx(0.002)
    assert schedule(5) == pytest.approx(0.002 + 0.018 * 0.5)
    assert schedule(9) == pytest.approx(0.002 + 0.018 * 0.9)
    assert schedule(10) == pytest.approx(0.02)
    assert schedule(19) == pytest.approx(0.02)
    # Levels multiply the initial rate, not the previous one: 0.02 * 0.02, not 0.02 * 0.1 * 0.02.
    assert schedule(20) == pytest.approx(0.002)
    assert schedule(29) == pytest.approx(0.002)
    assert schedule(30) == pytest.approx(0.0004)
    assert schedule(10_000) == pytest.approx(0.0004)


def test_no_warmup_starts_at_init() -> None:
    assert LRSchedule(init_learning_rate=0.1)(0) == 0.1


def test_from_spec_scales_both_rates() -> None:
    spec = ExperimentSpec(
        init_learning_rate=0.01,
        warmup_learning_rate=0.001,
        warmup_steps=4,
        learning_rate_steps=[8],
        learning_rate_decay_levels=[0.5],
    )
    schedule = LRSchedule.from_spec(spec, lr_scale=2.0)
    assert schedule(0) == pytest.approx(0.002)
    assert schedule(4) == pytest.approx(0.02)
    assert schedule(8) == pytest.approx(0.01)


def test_mismatched_levels_rejected() -> None:
    with pytest.raises(ValueError, match="same length"):
        LRSchedule(init_learning_rate=0.1, learning_rate_steps=(5,), learning_rate_decay_levels=())
