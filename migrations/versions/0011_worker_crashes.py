"""jobs count the times their worker process died running them (a segfault, the kernel's
OOM killer): a job that kills its worker twice fails instead of being sent again

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 14:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("worker_crashes", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("jobs", "worker_crashes")
