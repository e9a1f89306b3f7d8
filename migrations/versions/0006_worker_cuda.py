"""worker heartbeats carry each worker's CUDA check (``/readyz`` names a GPU worker whose
CUDA is unusable)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 11:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "worker_heartbeats",
        sa.Column("cuda", sa.Text(), nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_column("worker_heartbeats", "cuda")
