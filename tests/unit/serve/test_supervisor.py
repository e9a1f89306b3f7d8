"""The restart back-off of ``maskops serve``'s supervisor (the processes themselves are
exercised in tests/integration/embedded/test_embedded_supervision.py)."""

from __future__ import annotations

from maskops_serve.supervisor import Backoff


def test_backoff_doubles_to_its_limit_and_resets_after_a_stable_run() -> None:
    backoff = Backoff(first_s=1, limit_s=8, stable_s=60)
    assert [backoff.delay(ran_s=2) for _ in range(5)] == [1, 2, 4, 8, 8]
    # A child that ran a minute before dying is not crash-looping: start over.
    assert backoff.delay(ran_s=60) == 1
    assert backoff.delay(ran_s=0.5) == 2
