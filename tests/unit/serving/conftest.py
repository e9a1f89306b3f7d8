"""Fixtures of the serving tests."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from maskops.serving.repository import OPS_FILE


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    """The ops file as the Triton models load it: by path, outside the maskops package."""
    spec = importlib.util.spec_from_file_location("maskops_serving_ops_under_test", OPS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
