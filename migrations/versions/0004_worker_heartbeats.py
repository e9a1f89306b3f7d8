"""worker heartbeats (``/readyz`` reports a queue with work and no live worker)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 12:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "worker_heartbeats",
        sa.Column("hostname", sa.String(length=200), nullable=False),
        sa.Column("queues", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("hostname"),
    )


def downgrade() -> None:
    op.drop_table("worker_heartbeats")
