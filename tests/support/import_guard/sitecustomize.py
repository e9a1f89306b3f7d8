"""Loaded at interpreter start when this folder is on PYTHONPATH (tests only): makes the
top-level modules named in ``MASKOPS_TEST_BLOCKED_MODULES`` unimportable, as they are in a
service image that does not install them (see tests/support/extras.py)."""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_BLOCKED = frozenset(filter(None, os.environ.get("MASKOPS_TEST_BLOCKED_MODULES", "").split(",")))


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if fullname.split(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (not in this service's extra)", name=fullname
            )
        return None


if _BLOCKED:
    sys.meta_path.insert(0, _Blocker())
