"""bench/bench_api.py runs end to end at a tiny size and writes what its readers expect:
the polls with a bearer token go to an API that requires one, and their token checks are
answered from memory.

Correctness only: the figures of such a run mean nothing (a machine shared with the rest
of the suite); the published ones come from idle runs (bench/readme_table.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench import load_bench_module, run_bench

pytestmark = pytest.mark.integration


def test_bench_api_tiny_with_and_without_token(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    out = tmp_path / "api.json"
    run_bench("bench_api.py", "--clients", "4", "--submissions", "12", "--polls", "200",
              "--rounds", "2", "--listings", "8", "--database-url", postgres_url,
              "--redis-url", redis_url, "--out", str(out))  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["machine"]["cpus"] >= 1 and isinstance(doc["loaded"], bool)
    assert doc["idempotency_exact"] is True
    for arm in ("healthz", "status_poll", "status_poll_token"):
        assert doc[arm]["requests"] == 200 and doc[arm]["errors"] == 0  # 2 rounds of 100
        assert doc[arm]["p99_ms_by_round"]["rounds"] == 2
    # 3 rounds of 100 polls with the token (the warm-up too), every check from memory: the
    # token was verified by the check that auth is required, before the rounds.
    checks = doc["status_poll_token"]["token_checks"]
    assert checks["database"] == 0 and checks["memory"] >= 300
    readme_table = load_bench_module("readme_table")
    (row,) = (r for r in readme_table.ROWS if r.what.startswith("`GET /jobs/{id}`"))
    assert "a token on every poll" in row.figure(doc)
