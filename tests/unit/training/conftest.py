"""Variants of the shared ``tiny_spec`` for the training tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from maskops.spec.models import ExperimentSpec

SpecFactory = Callable[..., ExperimentSpec]


@pytest.fixture
def spec_factory(tiny_spec: ExperimentSpec) -> SpecFactory:
    """``spec_factory(total_steps=6, maskrcnn_config={"freeze_bn": True})``: ``tiny_spec``
    with fields replaced (nested configs merged), validated like any spec."""

    def factory(**overrides: Any) -> ExperimentSpec:
        data = tiny_spec.model_dump()
        for key in ("data_config", "maskrcnn_config"):
            data[key].update(overrides.pop(key, {}))
        data.update(overrides)
        return ExperimentSpec.model_validate(data)

    return factory
