"""Verified API tokens are answered from memory (no query per request, counted), and a
revocation made anywhere (here: straight in the database, as ``maskops token revoke`` from
another process does) takes effect in every API process within a second, through Postgres
notifications: with two app instances in this process, and with two real API processes
(``python -m maskops_api.server``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, event, text, update

from maskops_api.cache.job_cache import JobCache
from maskops_api.cache.token_cache import TokenCache
from maskops_api.main import create_app
from maskops_api.services.tokens import create_token
from maskops_core.db.models import ApiToken, Job, TokenScope, utcnow
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.integration.api.conftest import ApiProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def two_apis(clean_db: Settings) -> Iterator[list[TestClient]]:
    """Two API instances (as two processes would be) on one database, auth required."""
    exposed = clean_db.model_copy(update={"auth": "required"})
    with (
        TestClient(base_url="http://localhost", app=create_app(exposed)) as first,
        TestClient(base_url="http://localhost", app=create_app(exposed)) as second,
    ):
        for client in (first, second):
            cache: JobCache = client.app.state.job_cache  # type: ignore[attr-defined]
            assert cache.wait_live(10), "the notification listener did not connect"
        yield [first, second]


def _token(settings: Settings, **kwargs: object) -> tuple[int, str]:
    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        row, secret = create_token(session, name="t", scope=TokenScope.write, **kwargs)  # type: ignore[arg-type]
        token_id = row.id
    engine.dispose()
    return token_id, secret


def _status_within(clients: list[TestClient], secret: str, wanted: int, seconds: float) -> float:
    """Seconds until every client answers ``wanted`` for ``GET /datasets`` with ``secret``."""
    started = time.monotonic()
    while True:
        codes = [
            c.get("/datasets", headers={"Authorization": f"Bearer {secret}"}).status_code
            for c in clients
        ]
        elapsed = time.monotonic() - started
        if all(code == wanted for code in codes):
            return elapsed
        assert elapsed < seconds, f"still {codes} after {elapsed:.2f}s"
        time.sleep(0.02)


def _codes(clients: Sequence[httpx.Client], paths: list[str], secret: str) -> list[int]:
    auth = {"Authorization": f"Bearer {secret}"}
    return [c.get(path, headers=auth).status_code for c in clients for path in paths]


def _assert_expires_on_time(
    codes: Callable[[], list[int]], issued: float, created: float, lifetime_s: float
) -> None:
    """Every answer given before the token can have expired (it was created between the
    monotonic instants ``issued`` and ``created``) accepts it; a second after it certainly
    expired, every answer refuses it. Slow answers (a loaded machine) stay within that."""
    while True:
        started = time.monotonic()
        answered = codes()
        if time.monotonic() < issued + lifetime_s:
            assert set(answered) == {200}, f"{answered} before the token expired"
        elif set(answered) == {401}:
            return
        assert started < created + lifetime_s + 1.0, f"still {answered} a second after expiry"
        time.sleep(0.02)


def _cache(client: TestClient) -> TokenCache:
    cache: TokenCache = client.app.state.token_cache  # type: ignore[attr-defined]
    return cache


def test_token_checks_come_from_memory_until_revoked(
    two_apis: list[TestClient], clean_db: Settings
) -> None:
    token_id, secret = _token(clean_db)
    _status_within(two_apis, secret, 200, 1)
    hits = [_cache(c).hits for c in two_apis]
    for _ in range(5):
        _status_within(two_apis, secret, 200, 1)
    assert [_cache(c).hits - h for c, h in zip(two_apis, hits, strict=True)] == [5, 5]

    # Revoked from another connection (another process): no API instance is told directly.
    engine = create_engine(
        clean_db.database_url,
        connect_args={"options": f"-csearch_path={clean_db.database_schema}"},
    )
    with engine.begin() as conn:
        conn.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked_at=utcnow()))
    engine.dispose()
    assert _status_within(two_apis, secret, 401, 1.0) < 1.0


def test_a_kept_token_stops_working_when_it_expires(
    two_apis: list[TestClient], clean_db: Settings
) -> None:
    lifetime_s = 3.0
    issued = time.monotonic()
    _, secret = _token(clean_db, expires_in_days=lifetime_s / 86400)
    created = time.monotonic()
    assert _codes(two_apis, ["/datasets"] * 2, secret) == [200] * 4
    assert all(_cache(c).hits for c in two_apis)
    # No notification comes for an expiry: the entry itself ends with the token.
    _assert_expires_on_time(lambda: _codes(two_apis, ["/datasets"], secret), issued, created,
                            lifetime_s)  # fmt: skip


def test_unknown_tokens_are_refused(two_apis: list[TestClient]) -> None:
    _status_within(two_apis, "mko_not-a-token", 401, 1)


def test_authenticated_polls_come_from_memory_until_the_token_is_revoked(
    two_apis: list[TestClient], clean_db: Settings
) -> None:
    token_id, secret = _token(clean_db)
    auth = {"Authorization": f"Bearer {secret}"}
    first = two_apis[0]
    job_id = _queued_job(clean_db)
    jobs: JobCache = first.app.state.job_cache  # type: ignore[attr-defined]
    assert first.get(f"/jobs/{job_id}", headers=auth).status_code == 200  # fills both caches
    hits, misses = jobs.hits, jobs.misses
    for _ in range(10):
        assert first.get(f"/jobs/{job_id}", headers=auth).json()["status"] == "queued"
    assert (jobs.hits - hits, jobs.misses) == (10, misses)
    # No token, or an unknown one, is never answered from memory.
    assert first.get(f"/jobs/{job_id}").status_code == 401
    assert first.get(f"/jobs/{job_id}", headers={"Authorization": "Bearer x"}).status_code == 401
    engine = create_engine(
        clean_db.database_url,
        connect_args={"options": f"-csearch_path={clean_db.database_schema}"},
    )
    with engine.begin() as conn:
        conn.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked_at=utcnow()))
    engine.dispose()
    started = time.monotonic()
    while first.get(f"/jobs/{job_id}", headers=auth).status_code != 401:
        assert time.monotonic() - started < 1.0, "a revoked token still read the job"
        time.sleep(0.02)


def test_verified_tokens_cost_no_query_per_request(
    two_apis: list[TestClient], clean_db: Settings
) -> None:
    """Every statement the app sends to Postgres is counted: once a token is verified,
    neither polls (answered ahead of the routes) nor routed requests read ``api_tokens``."""
    _, secret = _token(clean_db)
    auth = {"Authorization": f"Bearer {secret}"}
    api = two_apis[0]
    job_id = _queued_job(clean_db)
    engine: Engine = api.app.state.session_factory.kw["bind"]  # type: ignore[attr-defined]
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))  # (connection, cursor, statement, ...)

    event.listen(engine, "before_cursor_execute", count)
    try:
        assert api.get(f"/jobs/{job_id}", headers=auth).status_code == 200
        assert sum("api_tokens" in s for s in statements) == 1  # the first check reads it
        statements.clear()
        for _ in range(50):
            assert api.get(f"/jobs/{job_id}", headers=auth).status_code == 200
        assert statements == []  # token and job both from memory
        for _ in range(20):
            assert api.get("/datasets", headers=auth).status_code == 200
        assert len(statements) >= 20  # the listing itself is read each time...
        assert not [s for s in statements if "api_tokens" in s]  # ...the token never is
    finally:
        event.remove(engine, "before_cursor_execute", count)


@pytest.fixture(scope="module")
def two_api_processes(
    api_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[httpx.Client]]:
    """Two ``python -m maskops_api.server`` processes on one database, auth required,
    each with its notification listener connected."""
    processes = [
        ApiProcess(
            Path(sys.executable),
            api_settings,
            tmp_path_factory.mktemp(f"api{index}"),
            {"MASKOPS_AUTH": "required"},
        )
        for index in range(2)
    ]
    clients: list[httpx.Client] = []
    try:
        for process in processes:
            clients.append(process.start())
        for client in clients:
            _wait_listening(client)
        yield clients
    finally:
        for client in clients:
            client.close()
        for process in processes:
            process.stop()


def _wait_listening(client: httpx.Client, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while "maskops_job_cache_live 1.0" not in client.get("/metrics").text:
        assert time.monotonic() < deadline, "the API's notification listener did not connect"
        time.sleep(0.1)


def _token_checks(client: httpx.Client) -> dict[str, float]:
    """``maskops_token_checks_total`` by source, from the process's ``/metrics``."""
    found: dict[str, float] = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("maskops_token_checks_total{"):
            source = line.split('source="')[1].split('"')[0]
            found[source] = float(line.rsplit(" ", 1)[1])
    return found


def _queued_job(settings: Settings) -> int:
    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        job = Job(action="train", queue="gpu", options={})
        session.add(job)
        session.commit()
        job_id = job.id
    engine.dispose()
    return job_id


def test_a_revocation_reaches_every_api_process_within_a_second(
    two_api_processes: list[httpx.Client], api_settings: Settings
) -> None:
    token_id, secret = _token(api_settings)
    paths = [f"/jobs/{_queued_job(api_settings)}", "/datasets"]
    assert _codes(two_api_processes, paths, secret) == [200] * 4  # verified: now in memory
    # Revoked without telling anyone (no trigger fires in a replica-role session): both
    # processes go on accepting it, so they answer from memory, not from the row.
    engine = make_engine(api_settings)
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked_at=utcnow()))
    engine.dispose()
    before = [_token_checks(c) for c in two_api_processes]
    for _ in range(5):
        assert _codes(two_api_processes, paths, secret) == [200] * 4
    after = [_token_checks(c) for c in two_api_processes]
    # As /metrics counts them: ten checks per process, all from memory.
    assert [(a["memory"] - b["memory"], a["database"] - b["database"])
            for a, b in zip(after, before, strict=True)] == [(10, 0), (10, 0)]  # fmt: skip
    # Revoked as `maskops token revoke` does it (an ORM update of the row, committed).
    engine = make_engine(api_settings)
    with make_session_factory(engine)() as session:
        token = session.get(ApiToken, token_id)
        assert token is not None
        token.revoked_at = utcnow()
        started = time.monotonic()
        session.commit()
    engine.dispose()
    while (codes := _codes(two_api_processes, paths, secret)) != [401] * 4:
        assert time.monotonic() - started < 1.0, f"still {codes} after the revocation"
        time.sleep(0.02)


def test_an_expiry_reaches_every_api_process_on_time(
    two_api_processes: list[httpx.Client], api_settings: Settings
) -> None:
    lifetime_s = 3.0
    paths = [f"/jobs/{_queued_job(api_settings)}", "/datasets"]
    issued = time.monotonic()
    _, secret = _token(api_settings, expires_in_days=lifetime_s / 86400)
    created = time.monotonic()
    assert _codes(two_api_processes, paths * 2, secret) == [200] * 8
    _assert_expires_on_time(lambda: _codes(two_api_processes, paths, secret), issued, created,
                            lifetime_s)  # fmt: skip


def test_a_token_in_use_is_read_again_ahead_of_its_end(clean_db: Settings) -> None:
    """Checks never wait for the database while a token is polled: it is read again in the
    background after half its time in memory, once, not by every client whose check found
    the entry run out."""
    _, secret = _token(clean_db)
    engine = make_engine(clean_db)
    cache = TokenCache(make_session_factory(engine), schema=clean_db.database_schema, ttl_s=2)
    cache.set_live(True)  # as the notification listener does once connected
    try:
        assert cache.cached(secret) is None and cache.load(secret) == "write"
        started = time.monotonic()
        while time.monotonic() - started < 4.5:  # two entries' time and more
            assert cache.cached(secret) == "write", "a check found no entry"
            time.sleep(0.005)
        assert cache.misses == 1 and 3 <= cache.refreshes <= 5
    finally:
        cache.close()
        engine.dispose()
