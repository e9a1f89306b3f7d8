"""the database gets an identity that job messages name (a worker runs only its own
database's jobs, whatever the broker's queue names)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 14:30:00
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "database_identity",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("uuid", sa.String(36), nullable=False),
    )
    op.bulk_insert(table, [{"id": 1, "uuid": str(uuid.uuid4())}])


def downgrade() -> None:
    op.drop_table("database_identity")
