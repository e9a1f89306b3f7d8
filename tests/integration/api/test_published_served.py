"""A Triton that (re)starts loads nothing by itself (explicit model control, as in the
production stack): the control plane loads the published models, and only those."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from maskops.serving import client as triton
from maskops_api.serving.published import serve_published
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
    from maskops.serving.launcher import TritonServer

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


def test_infer_on_a_published_model_triton_has_not_loaded_is_503(
    clean_db: Settings, tmp_path: Path
) -> None:
    """Right after a Triton restart the published models are not loaded for a few seconds:
    a temporary condition (503 with Retry-After), not a missing model (404)."""
    import io

    from fastapi.testclient import TestClient
    from PIL import Image

    from maskops.serving.launcher import TritonServer
    from maskops_api.main import create_app

    repository = tmp_path / "repository"
    toy_model(repository, "live")
    engine = make_engine(clean_db)
    _publish_rows(make_session_factory(engine), live=True)
    engine.dispose()
    image = io.BytesIO()
    Image.new("RGB", (16, 16)).save(image, "PNG")
    with TritonServer(repository, models=(), log_file=tmp_path / "triton.log") as server:
        served = clean_db.model_copy(update={"triton_url": server.http_url})
        with TestClient(base_url="http://localhost", app=create_app(served)) as api:
            response = api.post(
                "/infer", params={"model": "live"}, files=[("images", ("x.png", image.getvalue()))]
            )
    assert response.status_code == 503, response.text
    assert "published but not loaded in Triton yet" in response.json()["detail"]
    assert response.headers["Retry-After"] == "5"


def test_readyz_names_a_published_model_that_triton_does_not_serve(
    clean_db: Settings, tmp_path: Path
) -> None:
    """A published model unloaded behind the control plane's back (or lost with a Triton
    restart) makes /infer answer 503: /readyz says so, naming it, until it is loaded again."""
    from fastapi.testclient import TestClient

    from maskops.serving.launcher import TritonServer
    from maskops_api.main import create_app

    repository = tmp_path / "repository"
    toy_model(repository, "live")
    engine = make_engine(clean_db)
    factory = make_session_factory(engine)
    _publish_rows(factory, live=True)
    try:
        with TritonServer(repository, models=(), log_file=tmp_path / "triton.log") as server:
            served = clean_db.model_copy(update={"triton_url": server.http_url})
            with TestClient(base_url="http://localhost", app=create_app(served)) as api:
                serve_published(factory, server.http_url)
                assert api.get("/readyz").json()["checks"]["triton"] == "ok"
                triton.unload_model(server.http_url, "live")
                answer = api.get("/readyz")
                assert answer.status_code == 503
                assert answer.json()["checks"]["triton"] == "published but not loaded: live"
                serve_published(factory, server.http_url)  # the reconciler's next pass
                assert api.get("/readyz").json()["checks"]["triton"] == "ok"
    finally:
        engine.dispose()
