"""a worker's heartbeat row says when its last tasks all failed on its database or broker

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 14:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "worker_heartbeats",
        sa.Column("failing", sa.Text(), nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_column("worker_heartbeats", "failing")
