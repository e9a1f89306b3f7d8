"""Shared test configuration.

Tests that need Postgres or Redis use the ``postgres_url`` / ``redis_url`` fixtures. Where a
service is unreachable they skip, except under CI (``MASKOPS_REQUIRE_SERVICES=1``, set by
``.ci/run``), where they fail: CI must exercise the real services.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

import pytest
import torch

POSTGRES_URL = os.environ.get(
    "MASKOPS_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("MASKOPS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or default_port)
    try:
        with socket.create_connection(address, timeout=2):
            return True
    except OSError:
        return False


def _require(url: str, default_port: int, what: str) -> str:
    if _reachable(url, default_port):
        return url
    message = f"{what} is not reachable at {url}"
    if os.environ.get("MASKOPS_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return _require(POSTGRES_URL, 5432, "PostgreSQL")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _require(REDIS_URL, 6379, "Redis")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
