"""Fixtures of the pruning tests (helpers live in tests.unit.prune.small)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # Small convs on a shared 2-core machine run faster without intra-op threading.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
