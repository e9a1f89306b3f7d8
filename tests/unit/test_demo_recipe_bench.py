"""bench/demo_recipe.py's arithmetic: training minutes leave the evaluations out."""

from __future__ import annotations

import pytest

from tests.support.bench import load_bench_module

demo_recipe = load_bench_module("demo_recipe")


def test_an_evaluating_step_counts_as_a_typical_step() -> None:
    # Steps 1-4 take 1.5 s each, step 5 evaluates for another 60 s, step 6 takes 1.5 s.
    durations = {1: 1.5, 2: 1.5, 3: 1.5, 4: 1.5, 5: 61.5, 6: 1.5}

    minutes = demo_recipe.training_minutes(durations, eval_steps={5})

    assert minutes[4] == pytest.approx(6.0 / 60)
    assert minutes[5] == pytest.approx(7.5 / 60)
    assert minutes[6] == pytest.approx(9.0 / 60)


def test_the_typical_step_is_the_median_of_the_steps_without_evaluation() -> None:
    durations = {1: 9.0, 2: 1.0, 3: 1.0, 4: 30.0}

    minutes = demo_recipe.training_minutes(durations, eval_steps={4})

    assert minutes[4] == pytest.approx((9.0 + 1.0 + 1.0 + 1.0) / 60)
