"""``/ui``: the pages are shells that hold no data, name only this server's assets (all
served from the package), send a Content-Security-Policy without inline script or style,
and stay out of the OpenAPI schema; with tokens required the data they fetch is refused
without one.

tests/integration/api/test_dashboard.py drives the pages in a real, offline browser.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from maskops_api.docs_ui import STATIC_DIR
from maskops_api.main import create_app
from maskops_core.settings import Settings
from tests.unit.api.conftest import RecordingDispatcher

PAGES = ("/ui", "/ui/", "/ui/jobs/1", "/ui/datasets", "/ui/models")
ASSET = re.compile(r"""(?:src|href)="([^"]+)\"""")


@pytest.fixture
def auth_client(settings: Settings) -> Iterator[TestClient]:
    secured = settings.model_copy(update={"auth": "required"})
    app = create_app(secured, dispatcher=RecordingDispatcher())
    with TestClient(base_url="http://localhost", app=app) as test_client:
        yield test_client


@pytest.mark.parametrize("page", PAGES)
def test_pages_are_data_free_shells_with_a_strict_policy(
    auth_client: TestClient, page: str
) -> None:
    response = auth_client.get(page)  # no token: the shell is public, like /docs
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "http://" not in response.text and "https://" not in response.text
    # Scripts come from files only: no inline code, no inline style.
    assert "<script>" not in response.text and "<style" not in response.text
    assert " style=" not in response.text
    policy = response.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self';" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy and "http" not in policy
    assert response.headers["cache-control"] == "no-store"


def test_every_asset_the_pages_name_is_served_from_the_package(client: TestClient) -> None:
    assets = {
        url
        for page in PAGES
        for url in ASSET.findall(client.get(page).text)
        if url.startswith("/ui/assets/")
    }
    assert {
        "/ui/assets/dashboard.js",
        "/ui/assets/dashboard.css",
        "/ui/assets/chartjs/chart.umd.min.js",
    } <= assets
    for url in assets:
        response = client.get(url)
        assert response.status_code == 200, url
        relative = url.removeprefix("/ui/assets/")
        assert response.content == (STATIC_DIR / "dashboard" / relative).read_bytes(), url
    assert (STATIC_DIR / "dashboard" / "chartjs" / "LICENSE.md").is_file()


def test_the_data_the_pages_fetch_needs_a_token(auth_client: TestClient) -> None:
    for path in ("/jobs", "/jobs/1", "/jobs/1/metrics", "/jobs/1/logs", "/datasets", "/models"):
        assert auth_client.get(path).status_code == 401, path


def test_pages_are_not_in_the_schema_and_ids_are_checked(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]
    assert client.get("/ui/jobs/abc").status_code == 404
