"""Migrations: an existing database upgrades with its rows, ids and foreign keys kept."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from maskops_core.db.migrate import migrate, upgrade_head
from maskops_core.db.session import make_engine
from maskops_core.settings import Settings
from tests.support.experiment_versions import check_migration_0010


def test_migrating_an_existing_sqlite_database_keeps_its_rows(tmp_path: Path) -> None:
    """Migration 0007 recreates every table with an id: rows, ids and foreign keys (with
    their ON DELETE actions) survive, and the newest id is not given out again."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'old.db'}",
        _env_file=None,  # type: ignore[call-arg]
    )
    migrate(settings, "0006")
    engine = make_engine(settings)
    row = "'{}', 'q', 0, 0, '2026-01-01', '2026-01-01'"
    with engine.begin() as conn:
        for job_id, parent in ((1, "NULL"), (2, "1"), (3, "NULL")):
            conn.execute(
                text(
                    "INSERT INTO jobs (id, action, status, parent_job_id, options, queue, "
                    f"attempts, dispatch_count, created_at, updated_at) "
                    f"VALUES ({job_id}, 'train', 'succeeded', {parent}, {row})"
                )
            )
        conn.execute(
            text(
                'INSERT INTO job_metrics (job_id, step, "values", created_at) '
                "VALUES (2, 1, '{}', '2026-01-01')"
            )
        )
        conn.execute(text("DELETE FROM jobs WHERE id = 3"))
    engine.dispose()
    upgrade_head(settings)
    engine = make_engine(settings)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT id, parent_job_id FROM jobs")).all() == [
            (1, None),
            (2, 1),
        ]
        conn.execute(text("DELETE FROM jobs WHERE id = 2"))  # its metrics go with it
        assert conn.execute(text("SELECT count(*) FROM job_metrics")).scalar() == 0
        conn.execute(
            text(
                "INSERT INTO jobs (action, status, options, queue, attempts, dispatch_count, "
                "created_at, updated_at) VALUES ('train', 'queued', '{}', 'q', 0, 0, "
                "'2026-01-01', '2026-01-01')"
            )
        )
        assert conn.execute(text("SELECT max(id) FROM jobs")).scalar() == 3
    engine.dispose()


def test_migration_0010_marks_trial_versions_on_sqlite(tmp_path: Path) -> None:
    check_migration_0010(
        Settings(
            database_url=f"sqlite:///{tmp_path / 'old.db'}",
            _env_file=None,  # type: ignore[call-arg]
        )
    )
