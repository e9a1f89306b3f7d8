"""notify listeners when an API token row changes (Postgres)

The API keeps verified tokens in memory (maskops_api.cache.token_cache) and drops one as soon
as Postgres says its row changed: a revocation by ``maskops token revoke`` (or any other
process) takes effect in every API process at once. SQLite has no notifications: there
every request's token is read from the database.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The payload is "<schema>:<token hash>" (what the cache is keyed by), or "<schema>:*"
# when the table was truncated.
_STATEMENTS = """CREATE FUNCTION maskops_notify_token_row() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify(
        'maskops_token_changed', TG_TABLE_SCHEMA || ':' || COALESCE(OLD.token_hash, NEW.token_hash)
    );
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE FUNCTION maskops_notify_tokens_truncated() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('maskops_token_changed', TG_TABLE_SCHEMA || ':*');
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER api_tokens_notify_row AFTER UPDATE OR DELETE ON api_tokens
    FOR EACH ROW EXECUTE FUNCTION maskops_notify_token_row();

CREATE TRIGGER api_tokens_notify_truncate AFTER TRUNCATE ON api_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION maskops_notify_tokens_truncated();"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in _STATEMENTS.split("\n\n"):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER api_tokens_notify_truncate ON api_tokens")
    op.execute("DROP TRIGGER api_tokens_notify_row ON api_tokens")
    op.execute("DROP FUNCTION maskops_notify_tokens_truncated()")
    op.execute("DROP FUNCTION maskops_notify_token_row()")
