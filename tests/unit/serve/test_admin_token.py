"""``maskops serve`` with auth required: one admin token, created on the first start (with
an expiry) and stored under the state dir; later starts reuse it instead of adding one."""

from __future__ import annotations

import stat
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.services.tokens import find_token
from maskops_core.db.models import ApiToken, utcnow
from maskops_core.settings import Settings
from maskops_serve.embedded import ADMIN_TOKEN_DAYS, admin_token


def _tokens(factory: sessionmaker[Session]) -> list[ApiToken]:
    with factory() as session:
        return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def test_restarts_reuse_the_stored_token(
    settings: Settings, factory: sessionmaker[Session], tmp_path: Path
) -> None:
    path = tmp_path / "admin-token"
    first, created = admin_token(settings, path)
    assert created and path.read_text().strip() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, created_again = admin_token(settings, path)
    assert (again, created_again) == (first, False)
    [row] = _tokens(factory)
    assert row.scope == "admin" and row.expires_at is not None
    assert (row.expires_at - utcnow()).days in (ADMIN_TOKEN_DAYS - 1, ADMIN_TOKEN_DAYS)


def test_a_new_token_revokes_the_old_one(
    settings: Settings, factory: sessionmaker[Session], tmp_path: Path
) -> None:
    path = tmp_path / "admin-token"
    old, _ = admin_token(settings, path)
    new, created = admin_token(settings, path, renew=True)
    assert created and new != old and path.read_text().strip() == new
    with factory() as session:
        assert find_token(session, old) is None and find_token(session, new) is not None


def test_an_expired_stored_token_is_replaced(
    settings: Settings, factory: sessionmaker[Session], tmp_path: Path
) -> None:
    path = tmp_path / "admin-token"
    old, _ = admin_token(settings, path)
    with factory() as session:
        session.execute(update(ApiToken).values(expires_at=utcnow()))
        session.commit()
    new, created = admin_token(settings, path)
    assert created and new != old and len(_tokens(factory)) == 2
    with factory() as session:
        assert find_token(session, old) is None and find_token(session, new) is not None


def test_serve_says_where_the_token_is_never_the_token(settings: Settings, tmp_path: Path) -> None:
    from maskops_serve.embedded import announce_admin_token

    path = tmp_path / "admin-token"
    said: list[str] = []
    first = announce_admin_token(settings, path, renew=False, say=said.append)
    again = announce_admin_token(settings, path, renew=False, say=said.append)
    assert first == again == path.read_text().strip()
    assert not [line for line in said if first in line], said
    assert said[0] == (
        f"token:    created (admin, expires in {ADMIN_TOKEN_DAYS} days), stored in {path} "
        "(mode 0600; --new-token replaces it)"
    )
    assert said[1] == f"token:    stored in {path} (mode 0600; --new-token replaces it)"
