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


def _maskops_object(obj: object, name: str | None, type_: str, *_: object) -> bool:
    """Autogenerate compares maskops' models only: Optuna's study tables (migration 0009)
    are not among them."""
    from maskops_core.automl import study_tables

    return not (type_ == "table" and name in study_tables())


def _run(connection: Connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # SQLite alters a table by recreating it (batch mode), and dropping a table that
        # others refer to with foreign keys on would delete or refuse their rows. The
        # pragma is ignored inside a transaction: it is set before the first write, and
        # lasts as long as this connection, which the callers close after migrating.
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        if connection.exec_driver_sql("PRAGMA foreign_keys").scalar():
            raise RuntimeError("SQLite foreign keys could not be turned off for migrating")
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=sqlite,
        include_object=_maskops_object,
    )
    with context.begin_transaction():
        context.run_migrations()
        if sqlite:
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"migrating broke foreign keys: {broken[:5]}")


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
