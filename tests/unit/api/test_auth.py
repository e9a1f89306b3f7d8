"""Bearer tokens: required beyond loopback; scopes read < write < admin; expiry; revocation.
Tokens are made by the real ``maskops token`` command."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.security import HTTPBearer
from fastapi.testclient import TestClient
from sqlalchemy import update
from starlette.requests import Request

from maskops.cli.main import main as maskops_main
from maskops_api.auth import bearer_secret
from maskops_api.main import create_app
from maskops_core.db.models import ApiToken, utcnow
from maskops_core.settings import Settings
from tests.unit.api.conftest import DATASET_BODY, RecordingDispatcher


def _token(settings: Settings, scope: str, *extra: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = maskops_main(
            ["token", "create", "--name", scope, "--scope", scope,
             "--database-url", settings.database_url, *extra]
        )  # fmt: skip
    assert code == 0
    return out.getvalue().splitlines()[0]


@pytest.fixture
def public_client(settings: Settings) -> Iterator[TestClient]:
    exposed = settings.model_copy(update={"host": "0.0.0.0"})
    assert exposed.auth_required
    with TestClient(
        base_url="http://localhost", app=create_app(exposed, dispatcher=RecordingDispatcher())
    ) as client:
        yield client


def test_no_token_wrong_scope_and_health_open(
    public_client: TestClient, settings: Settings
) -> None:
    assert public_client.get("/healthz").status_code == 200
    missing = public_client.get("/jobs")
    assert missing.status_code == 401 and "token is required" in missing.json()["detail"]
    assert missing.headers["www-authenticate"] == "Bearer"
    bogus = public_client.get("/jobs", headers={"Authorization": "Bearer mko_nope"})
    assert bogus.status_code == 401
    read = {"Authorization": f"Bearer {_token(settings, 'read')}"}
    assert public_client.get("/jobs", headers=read).status_code == 200
    denied = public_client.post("/datasets", json=DATASET_BODY, headers=read)
    assert denied.status_code == 403 and "'write' is needed" in denied.json()["detail"]
    write = {"Authorization": f"Bearer {_token(settings, 'write')}"}
    assert public_client.post("/datasets", json=DATASET_BODY, headers=write).status_code == 201
    admin = {"Authorization": f"Bearer {_token(settings, 'admin')}"}
    assert public_client.post("/jobs/1/cancel", headers=admin).status_code == 200


def test_expired_and_revoked_tokens(public_client: TestClient, settings: Settings, factory) -> None:
    secret = _token(settings, "read", "--expires-in-days", "1")
    headers = {"Authorization": f"Bearer {secret}"}
    assert public_client.get("/jobs", headers=headers).status_code == 200
    with factory() as s, s.begin():
        s.execute(update(ApiToken).values(expires_at=utcnow() - timedelta(seconds=1)))
    expired = public_client.get("/jobs", headers=headers)
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]

    other = _token(settings, "read")
    with factory() as s:
        token_id = max(t.id for t in s.query(ApiToken).all())
    assert (
        maskops_main(["token", "revoke", str(token_id), "--database-url", settings.database_url])
        == 0
    )
    revoked = public_client.get("/jobs", headers={"Authorization": f"Bearer {other}"})
    assert revoked.status_code == 401


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", "Bearer mko_a", "bearer  mko_a ", "BEARER mko_a b", " Bearer x",
     "Basic mko_a", "Bearer\tmko_a"],
)  # fmt: skip
def test_the_token_check_reads_the_header_as_the_documented_scheme(header: str | None) -> None:
    """The status fast path and the routes read one token from the header, the one the
    OpenAPI document's bearer scheme (FastAPI's ``HTTPBearer``) reads."""
    headers = [] if header is None else [(b"authorization", header.encode("latin-1"))]
    request = Request({"type": "http", "headers": headers})
    credentials = asyncio.run(HTTPBearer(auto_error=False)(request))
    assert bearer_secret(header) == (credentials.credentials if credentials else None)


def test_tokens_are_stored_hashed(settings: Settings, factory) -> None:
    secret = _token(settings, "write")
    with factory() as s:
        stored = [t.token_hash for t in s.query(ApiToken).all()]
    assert secret.startswith("mko_") and secret not in stored and len(stored[0]) == 64


def test_token_command_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], settings) -> None:
    code = maskops_main(["token", "revoke", "999", "--database-url", settings.database_url])
    assert code == 2
    assert capsys.readouterr().err.strip() == "maskops token: error: no token with id 999"
