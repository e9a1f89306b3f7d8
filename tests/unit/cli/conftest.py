"""Fixtures of the command-line tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    """``maskops train`` in this process installs SIGINT/SIGTERM handlers: put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
