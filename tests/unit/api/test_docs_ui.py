"""``/docs`` and ``/redoc`` come with their assets from the package: no external URL in the
pages, every asset they name is served, and all of it is public when tokens are required.

tests/integration/api/test_docs_ui.py renders both pages in a real, offline browser.
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

PAGES = ("/docs", "/redoc", "/docs/oauth2-redirect")
ASSET = re.compile(r"""(?:src|href)="([^"]+)\"""")


@pytest.fixture
def auth_client(settings: Settings) -> Iterator[TestClient]:
    secured = settings.model_copy(update={"auth": "required"})
    assert secured.auth_required
    app = create_app(secured, dispatcher=RecordingDispatcher())
    with TestClient(base_url="http://localhost", app=app) as test_client:
        yield test_client


@pytest.mark.parametrize("page", PAGES)
def test_pages_name_no_external_url(client: TestClient, page: str) -> None:
    response = client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "http://" not in response.text and "https://" not in response.text
    assert "//" not in "".join(ASSET.findall(response.text))
    # The browser may fetch from this server only (ReDoc would fetch a logo from a CDN).
    policy = response.headers["content-security-policy"]
    assert policy.startswith("default-src 'self' ") and "http" not in policy


def test_every_asset_the_pages_name_is_served(client: TestClient) -> None:
    assets = {url for page in PAGES for url in ASSET.findall(client.get(page).text)}
    assert {
        "/docs/assets/swagger-ui/swagger-ui-bundle.js",
        "/docs/assets/swagger-ui/swagger-ui.css",
        "/docs/assets/swagger-ui/favicon-32x32.png",
        "/docs/assets/redoc/redoc.standalone.js",
    } <= assets
    for url in assets:
        response = client.get(url)
        assert response.status_code == 200, url
        relative = url.removeprefix("/docs/assets/")
        assert response.content == (STATIC_DIR / relative).read_bytes(), url
    swagger = client.get("/docs").text
    assert "url: '/openapi.json'" in swagger
    assert "oauth2RedirectUrl: window.location.origin + '/docs/oauth2-redirect'" in swagger
    assert 'spec-url="/openapi.json"' in client.get("/redoc").text


def test_vendored_assets_keep_their_licences() -> None:
    for folder in ("swagger-ui", "redoc"):
        assert (STATIC_DIR / folder / "LICENSE").stat().st_size > 500
    assert "swagger-ui-dist 5.35.0" in (STATIC_DIR / "SOURCES.txt").read_text()


def test_docs_stay_public_when_tokens_are_required(auth_client: TestClient) -> None:
    assert auth_client.get("/datasets").status_code == 401
    for url in (*PAGES, "/openapi.json", "/docs/assets/swagger-ui/swagger-ui-bundle.js"):
        assert auth_client.get(url).status_code == 200, url


def test_docs_routes_stay_out_of_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [path for path in paths if path.startswith(("/docs", "/redoc"))]
    # One page per URL: FastAPI's CDN pages are gone, not shadowed.
    routes = [getattr(route, "path", None) for route in client.app.routes]  # type: ignore[attr-defined]
    assert routes.count("/docs") == routes.count("/redoc") == 1


def test_an_app_built_without_docs_gets_no_pages() -> None:
    from fastapi import FastAPI

    from maskops_api.docs_ui import install_docs_ui

    app = FastAPI(docs_url=None, redoc_url=None)
    install_docs_ui(app)
    with TestClient(base_url="http://localhost", app=app) as test_client:
        assert test_client.get("/docs").status_code == 404
        assert test_client.get("/redoc").status_code == 404
