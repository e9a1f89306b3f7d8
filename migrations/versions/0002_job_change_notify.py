"""notify listeners when a job row changes (Postgres)

The API keeps job rows in memory for status polls and drops one as soon as Postgres says
it changed (maskops_api.cache.job_cache). SQLite, the embedded default, has no notifications:
there the API reads every poll from the database.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 12:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The payload is "<schema>:<job id>", or "<schema>:*" when the table was truncated: one
# database may hold several maskops schemas (tests, side-by-side deployments).
_STATEMENTS = """CREATE FUNCTION maskops_notify_job_row() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('maskops_job_changed', TG_TABLE_SCHEMA || ':' || COALESCE(NEW.id, OLD.id));
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE FUNCTION maskops_notify_jobs_truncated() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('maskops_job_changed', TG_TABLE_SCHEMA || ':*');
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER jobs_notify_row AFTER UPDATE OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION maskops_notify_job_row();

CREATE TRIGGER jobs_notify_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION maskops_notify_jobs_truncated();"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in _STATEMENTS.split("\n\n"):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER jobs_notify_truncate ON jobs")
    op.execute("DROP TRIGGER jobs_notify_row ON jobs")
    op.execute("DROP FUNCTION maskops_notify_jobs_truncated()")
    op.execute("DROP FUNCTION maskops_notify_job_row()")
