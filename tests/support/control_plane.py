"""The control plane on a migrated SQLite database, for unit tests of the core, the API,
the worker's runner and the single-machine stack (the root conftest registers the fixtures).

The control plane's libraries are imported where the fixtures run, not when this module
loads: every test session loads it, the GPU check's ``pytest -m gpu`` on a GPU host with
the engine's dependencies only included (tests/unit/test_gpu_check.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from maskops_core.db.models import Job
    from maskops_core.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


def make_settings(tmp_path: Path) -> Settings:
    """Settings on a migrated SQLite database under ``tmp_path`` whose data root holds the
    empty ``shapes`` dataset of ``DATASET_BODY``."""
    from maskops_core.db.migrate import upgrade_head
    from maskops_core.settings import Settings

    data_root = tmp_path / "data"
    for split in ("train", "val"):
        (data_root / "shapes" / "images" / split).mkdir(parents=True)
    (data_root / "shapes" / "annotations").mkdir()
    for split in ("train", "val"):
        (data_root / "shapes" / "annotations" / f"{split}.json").write_text(
            json.dumps({"images": [], "annotations": [], "categories": []})
        )
    result = Settings(
        database_url=f"sqlite:///{tmp_path / 'maskops.db'}",
        broker_url="memory://",
        data_root=data_root,
        queue_prefix="t_",
        heartbeat_interval_s=0.05,
        heartbeat_timeout_s=30,
        redispatch_after_s=0,
        _env_file=None,  # type: ignore[call-arg]
    )
    upgrade_head(result)
    return result


@pytest.fixture
def factory(settings: Settings) -> Iterator[sessionmaker[Session]]:
    from maskops_core.db.session import make_engine, make_session_factory

    engine = make_engine(settings)
    yield make_session_factory(engine)
    engine.dispose()


def insert_job(factory: sessionmaker[Session], **values: Any) -> int:
    """A train job on queue ``t_gpu`` (queued unless ``values`` say otherwise)."""
    from maskops_core.db.models import Job

    with factory() as s, s.begin():
        job = Job(action="train", queue="t_gpu", options={}, **values)
        s.add(job)
        s.flush()
        return job.id


def get_job(factory: sessionmaker[Session], job_id: int) -> Job:
    from maskops_core.db.models import Job

    with factory() as s:
        return s.get_one(Job, job_id)
