"""Alembic environment: migrates the database that maskops_core.settings points at.

Programmatic callers (tests, ``maskops serve``) pass an open connection in
``config.attributes["connection"]``; the command line builds one from the settings.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text

from maskops_core.db.models import Base
from maskops_core.db.session import make_engine
from maskops_core.settings import Settings

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    settings = Settings()
    engine = make_engine(settings)
    with engine.connect() as conn:
        if settings.database_schema and conn.dialect.name == "postgresql":
            conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{settings.database_schema}"'))
            conn.commit()
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("maskops migrations run online only (set MASKOPS_DATABASE_URL)")
run_migrations_online()
