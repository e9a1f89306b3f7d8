"""Fixtures of the single-machine stack's tests: the API tests' migrated SQLite settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.unit.api.conftest import make_settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def factory(settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(settings)
    yield make_session_factory(engine)
    engine.dispose()
