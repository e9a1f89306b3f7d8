from __future__ import annotations

import pytest

from maskops.spec.models import ExperimentSpec
from maskops.training.rules import earlier
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
    assert schedule(20) == pytest.approx(0.02)
    # Levels multiply the initial rate, not the previous one: 0.02 * 0.02, not 0.02 * 0.1 * 0.02.
    assert schedule(21) == pytest.approx(0.002)
    assert schedule(30) == pytest.approx(0.002)
    assert schedule(31) == pytest.approx(0.0004)
    assert schedule(10_000) == pytest.approx(0.0004)


def test_boundary_step_keeps_the_previous_rate_as_tensorflow_piecewise_constant() -> None:
    """TAO: ``tf.where(global_step < warmup_steps, warmup, piecewise_constant(global_step,
    boundaries, values))`` with global_step 0 during the first update; piecewise_constant
    gives ``values[i]`` for ``boundaries[i-1] < step <= boundaries[i]``."""
    schedule = LRSchedule(
        init_learning_rate=0.1, learning_rate_steps=(3, 5), learning_rate_decay_levels=(0.5, 0.1)
    )
    assert [schedule(step) for step in range(8)] == pytest.approx(
        [0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.01, 0.01]
    )
    # A boundary inside the warmup: the warmup wins until it ends.
    inside = LRSchedule(
        init_learning_rate=0.1,
        warmup_learning_rate=0.0,
        warmup_steps=4,
        learning_rate_steps=(2,),
        learning_rate_decay_levels=(0.5,),
    )
    assert [inside(step) for step in range(6)] == pytest.approx(
        [0.0, 0.025, 0.05, 0.075, 0.05, 0.05]
    )


def test_no_warmup_starts_at_init() -> None:
    assert LRSchedule(init_learning_rate=0.1)(0) == 0.1


def test_from_spec_uses_the_rates_as_written() -> None:
    spec = ExperimentSpec(
        init_learning_rate=0.01,
        warmup_learning_rate=0.001,
        warmup_steps=4,
        learning_rate_steps=[8],
        learning_rate_decay_levels=[0.5],
    )
    schedule = LRSchedule.from_spec(spec)
    assert schedule(0) == pytest.approx(0.001)
    assert schedule(4) == pytest.approx(0.01)
    assert schedule(8) == pytest.approx(0.01)
    assert schedule(9) == pytest.approx(0.005)
    # The rules of an earlier maskops's 2-rank checkpoint: both rates x2, the new rate at
    # the boundary step itself.
    resumed = LRSchedule.from_spec(spec, earlier(2.0))
    assert resumed(0) == pytest.approx(0.002)
    assert resumed(4) == pytest.approx(0.02)
    assert resumed(8) == pytest.approx(0.01)


def test_mismatched_levels_rejected() -> None:
    with pytest.raises(ValueError, match="same length"):
        LRSchedule(init_learning_rate=0.1, learning_rate_steps=(5,), learning_rate_decay_levels=())
