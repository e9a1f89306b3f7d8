"""Loaded at interpreter start when this folder is on PYTHONPATH (tests only): hides the
top-level modules named in ``MASKOPS_TEST_BLOCKED_MODULES``, as in a service image that
does not install them (see tests/support/extras.py).

Each import finder is wrapped so that it does not find them: ``import`` raises
ModuleNotFoundError and ``importlib.util.find_spec`` answers None, exactly as for a
module that is not installed (libraries probe optional modules that way).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_BLOCKED = frozenset(filter(None, os.environ.get("MASKOPS_TEST_BLOCKED_MODULES", "").split(",")))


class _Hiding:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if fullname.split(".")[0] in _BLOCKED:
            return None
        return self.inner.find_spec(fullname, path, target)

    def __getattr__(self, name: str) -> Any:
        # Everything else (find_distributions for importlib.metadata, invalidate_caches)
        # is the wrapped finder's.
        return getattr(self.inner, name)


if _BLOCKED:
    sys.meta_path[:] = [_Hiding(finder) for finder in sys.meta_path]
