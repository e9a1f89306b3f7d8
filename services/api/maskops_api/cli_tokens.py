"""What ``maskops token`` does, against the control plane's database."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from maskops_api.services.tokens import create_token, token_state
from maskops_core.db.models import ApiToken, TokenScope, utcnow
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.names import name_problem
from maskops_core.settings import Settings


class TokenCommandError(Exception):
    pass


def run_token_command(
    action: str,
    *,
    database_url: str | None = None,
    name: str | None = None,
    scope: str | None = None,
    expires_in_days: float | None = None,
    token_id: int | None = None,
) -> Iterator[str]:
    """Lines to print for ``create`` / ``list`` / ``revoke``."""
    settings = Settings(database_url=database_url) if database_url else Settings()
    engine = make_engine(settings)
    factory = make_session_factory(engine)
    try:
        with factory() as session:
            if action == "create":
                if expires_in_days is not None and expires_in_days <= 0:
                    raise TokenCommandError("--expires-in-days must be > 0")
                if name is not None and (problem := name_problem(name)):
                    raise TokenCommandError(f"--name: {problem}")
                row, secret = create_token(
                    session,
                    name=name or "token",
                    scope=TokenScope(scope or "read"),
                    expires_in_days=expires_in_days,
                )
                expiry = row.expires_at.isoformat() if row.expires_at else "never"
                yield secret
                yield f"# token {row.id} {row.name!r}: scope {row.scope}, expires {expiry}"
            elif action == "list":
                for row in session.scalars(select(ApiToken).order_by(ApiToken.id)):
                    state = token_state(row)
                    yield f"{row.id}\t{row.name}\t{row.scope}\t{state}\t{row.expires_at or '-'}"
            elif action == "revoke":
                token = session.get(ApiToken, token_id)
                if token is None:
                    raise TokenCommandError(f"no token with id {token_id}")
                token.revoked_at = utcnow()
                session.commit()
                yield f"revoked token {token_id}"
            else:
                raise TokenCommandError(f"unknown action {action!r}")
    except SQLAlchemyError as exc:
        first = str(exc).splitlines()[0]
        raise TokenCommandError(f"database {settings.database_url}: {first}") from None
    finally:
        engine.dispose()
