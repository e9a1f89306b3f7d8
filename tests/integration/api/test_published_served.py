"""A Triton that (re)starts loads nothing by itself (explicit model control, as in the
production stack): the control plane loads the published models, and only those."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from maskops.serving import client as triton
from maskops_api.published import serve_published
from maskops_core.db.models import Job, PublishedModel
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.support.triton_toy import toy_model

pytestmark = pytest.mark.integration
pytest.importorskip("pytriton")


def _publish_rows(factory: sessionmaker[Session], **published: bool) -> None:
    with factory() as session, session.begin():
        export = Job(action="export", status="succeeded", queue="gpu", options={})
        session.add(export)
        session.flush()
        for name, is_published in published.items():
            session.add(
                PublishedModel(name=name, version=1, job_id=export.id, published=is_published)
            )


def _states(url: str) -> dict[str, str]:
    index = httpx.post(f"http://{url}/v2/repository/index", json={}, timeout=10).json()
    return {entry["name"]: entry.get("state", "") for entry in index}


def test_only_published_models_are_loaded_and_reloaded(clean_db: Settings, tmp_path: Path) -> None:
    from maskops_triton.launcher import TritonServer

    repository = tmp_path / "repository"
    for name in ("live", "withdrawn", "never"):
        toy_model(repository, name)
    engine = make_engine(clean_db)
    factory = make_session_factory(engine)
    _publish_rows(factory, live=True, withdrawn=False)
    try:
        with TritonServer(repository, models=(), log_file=tmp_path / "triton.log") as server:
            assert not triton.is_ready(server.http_url, "live")  # nothing loaded at start
            served = serve_published(factory, server.http_url)
            assert (served.loaded, served.failed) == (["live"], [])
            states = _states(server.http_url)
            assert states.get("live") == "READY"
            assert states.get("withdrawn", "") != "READY" and states.get("never", "") != "READY"

            assert serve_published(factory, server.http_url).loaded == []  # already served
            triton.unload_model(server.http_url, "live")  # as after a Triton restart
            assert serve_published(factory, server.http_url).loaded == ["live"]
            assert triton.is_ready(server.http_url, "live")
    finally:
        engine.dispose()
