"""worker heartbeats carry the GPUs each worker has (multi-GPU train jobs are checked at
the door against them)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 14:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "worker_heartbeats",
        sa.Column("gpus", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("worker_heartbeats", "gpus")
