"""AutoML: Optuna's study tables (studies, trials, their parameters, values and
intermediate values), next to maskops' own in the same database (and Postgres schema)

Optuna's own models define them (``optuna.storages._rdb.models``, schema version 12 in
optuna 4.9, the pinned version); maskops opens the storage with table creation and
Optuna's version check off (:func:`maskops_core.automl.study_storage`), so these tables
are made and changed here only. An Optuna upgrade that changes its schema needs a
migration of its own.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    from optuna import __version__ as optuna_version
    from optuna.storages._rdb import models

    bind = op.get_bind()
    models.BaseModel.metadata.create_all(bind)
    # Optuna reads the schema version from here (and writes it when it finds none).
    version_info = models.VersionInfoModel.__table__
    if bind.execute(version_info.select()).first() is None:
        bind.execute(
            version_info.insert().values(
                version_info_id=1,
                schema_version=models.SCHEMA_VERSION,
                library_version=optuna_version,
            )
        )


def downgrade() -> None:
    from optuna.storages._rdb import models

    models.BaseModel.metadata.drop_all(op.get_bind())
