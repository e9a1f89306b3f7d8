"""ids are never reused: SQLite tables with an integer id get ``AUTOINCREMENT``

Without it SQLite gives a new row the largest id in use plus one, so the id of the newest
row, once deleted, was given out again (a new job inherited the deleted job's folder and
log). SQLite sets ``AUTOINCREMENT`` only when a table is created: each table is recreated
(batch mode: copy, drop, rename; ``migrations/env.py`` turns foreign keys off for it) with
its rows and ids. Ids deleted before this migration above the largest one left may still
be given out once. Postgres ids come from sequences, which never give a value twice:
nothing to do there.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = (
    "datasets",
    "experiments",
    "experiment_versions",
    "jobs",
    "job_metrics",
    "models",
    "api_tokens",
)


def _recreate(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
        ):
            pass


def upgrade() -> None:
    _recreate(True)


def downgrade() -> None:
    _recreate(False)
