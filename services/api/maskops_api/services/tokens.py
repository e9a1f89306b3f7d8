"""API tokens: random bearer secrets stored as SHA-256 hashes, scoped read < write < admin."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from maskops_core.db.models import ApiToken, TokenScope, utcnow

SCOPE_RANK = {TokenScope.read: 0, TokenScope.write: 1, TokenScope.admin: 2}
PREFIX = "mko_"


def hash_token(token: str) -> str:
    # The tokens are 256-bit random secrets, so a fast hash is enough (no dictionary to guess).
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    session: Session, *, name: str, scope: TokenScope, expires_in_days: float | None = None
) -> tuple[ApiToken, str]:
    """Store a new token; returns the row and the secret (shown to the user once)."""
    secret = PREFIX + secrets.token_urlsafe(32)
    expires = utcnow() + timedelta(days=expires_in_days) if expires_in_days else None
    row = ApiToken(name=name, token_hash=hash_token(secret), scope=scope, expires_at=expires)
    session.add(row)
    session.commit()
    return row, secret


def find_token(session: Session, secret: str, *, now: datetime | None = None) -> ApiToken | None:
    """The live (not expired, not revoked) token with this secret."""
    row = session.scalars(
        select(ApiToken).where(ApiToken.token_hash == hash_token(secret))
    ).one_or_none()
    if row is None or token_state(row, now=now) != "active":
        return None
    return row


def token_state(row: ApiToken, *, now: datetime | None = None) -> str:
    """``revoked``, ``expired`` or ``active``: only an active token is accepted."""
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= (now or utcnow()):
        return "expired"
    return "active"


def revoke_secret(session: Session, secret: str) -> bool:
    """Revoke the token with this secret if it is still live; whether one was."""
    token = find_token(session, secret)
    if token is None:
        return False
    token.revoked_at = utcnow()
    session.commit()
    return True


def allows(granted: str, needed: TokenScope) -> bool:
    return SCOPE_RANK[TokenScope(granted)] >= SCOPE_RANK[needed]
