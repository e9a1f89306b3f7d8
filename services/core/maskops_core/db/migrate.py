"""Apply the Alembic migrations programmatically (tests, ``maskops serve``, container start)."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text

from maskops_core.db.session import make_engine
from maskops_core.settings import Settings


def migrations_dir() -> Path:
    """``MASKOPS_MIGRATIONS_DIR``, else ``migrations/`` at the repository root."""
    override = os.environ.get("MASKOPS_MIGRATIONS_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[4] / "migrations"


def upgrade_head(settings: Settings) -> None:
    """Bring the database (and Postgres schema, created if missing) to the latest revision."""
    migrate(settings, "head")


def migrate(settings: Settings, revision: str, *, down: bool = False) -> None:
    """Upgrade (``down``: downgrade) the database of ``settings`` to ``revision``, creating
    its Postgres schema if missing."""
    directory = migrations_dir()
    if not (directory / "env.py").is_file():
        raise RuntimeError(f"migrations not found at {directory} (set MASKOPS_MIGRATIONS_DIR)")
    config = Config()
    config.set_main_option("script_location", str(directory))
    config.attributes["configure_logger"] = False
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            if settings.database_schema and conn.dialect.name == "postgresql":
                conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{settings.database_schema}"'))
                conn.commit()
            config.attributes["connection"] = conn
            (command.downgrade if down else command.upgrade)(config, revision)
            conn.commit()
    finally:
        engine.dispose()
