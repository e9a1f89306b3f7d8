"""Swagger UI (``/docs``) and ReDoc (``/redoc``) served from the package itself.

FastAPI's own doc pages load their JavaScript, CSS, favicon and (ReDoc) fonts from
cdn.jsdelivr.net, fastapi.tiangolo.com and fonts.googleapis.com, so on a machine without
internet they render blank. ``install_docs_ui`` replaces those pages, at the same URLs, with
ones whose every asset comes from ``static/`` under ``/docs/assets`` (see
``static/SOURCES.txt`` for the vendored versions and licences): the HTML names no external
host at all, and a Content-Security-Policy keeps the browser on this server too (ReDoc's
sidebar would otherwise fetch Redocly's logo from cdn.redoc.ly; blocked, it hides itself).

Like FastAPI's pages they take no auth dependency, so the docs stay public when the API
requires tokens; ``/openapi.json``, which they load, is public too.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.routing import BaseRoute, Route

STATIC_DIR = Path(__file__).resolve().with_name("static")
ASSETS_PATH = "/docs/assets"
SWAGGER_JS = f"{ASSETS_PATH}/swagger-ui/swagger-ui-bundle.js"
SWAGGER_CSS = f"{ASSETS_PATH}/swagger-ui/swagger-ui.css"
FAVICON = f"{ASSETS_PATH}/swagger-ui/favicon-32x32.png"
REDOC_JS = f"{ASSETS_PATH}/redoc/redoc.standalone.js"
# Same origin only (plus inline code, eval, data: and blob: URLs, which both UIs use).
LOCAL_ONLY = "default-src 'self' 'unsafe-inline' 'unsafe-eval' data: blob:"


def install_docs_ui(app: FastAPI) -> None:
    """Serve ``app``'s docs pages (at its ``docs_url``, ``redoc_url`` and
    ``swagger_ui_oauth2_redirect_url``) from the vendored assets instead of a CDN.

    Call it after ``FastAPI(...)``: it takes out the CDN pages FastAPI registered there.
    A URL the app was built without (``docs_url=None``) stays without a page.
    """
    if app.openapi_url is None:
        return
    openapi_url = app.openapi_url
    docs_url, redoc_url = app.docs_url, app.redoc_url
    oauth2_url = app.swagger_ui_oauth2_redirect_url if docs_url else None
    taken = {url for url in (docs_url, redoc_url, oauth2_url) if url}
    app.router.routes[:] = [route for route in app.router.routes if not _serves(route, taken)]

    app.mount(ASSETS_PATH, StaticFiles(directory=STATIC_DIR), name="docs-assets")

    if docs_url:

        async def swagger_ui(request: Request) -> HTMLResponse:
            root = _root_path(request)
            return _local_only(
                get_swagger_ui_html(
                    openapi_url=root + openapi_url,
                    title=f"{app.title} - Swagger UI",
                    swagger_js_url=root + SWAGGER_JS,
                    swagger_css_url=root + SWAGGER_CSS,
                    swagger_favicon_url=root + FAVICON,
                    oauth2_redirect_url=root + oauth2_url if oauth2_url else None,
                    init_oauth=app.swagger_ui_init_oauth,
                    # No spec validation badge fetched from validator.swagger.io.
                    swagger_ui_parameters={
                        **(app.swagger_ui_parameters or {}),
                        "validatorUrl": None,
                    },
                )
            )

        app.add_route(docs_url, swagger_ui, include_in_schema=False)

    if oauth2_url:

        async def swagger_ui_redirect(_: Request) -> HTMLResponse:
            return _local_only(get_swagger_ui_oauth2_redirect_html())

        app.add_route(oauth2_url, swagger_ui_redirect, include_in_schema=False)

    if redoc_url:

        async def redoc(request: Request) -> HTMLResponse:
            root = _root_path(request)
            return _local_only(
                get_redoc_html(
                    openapi_url=root + openapi_url,
                    title=f"{app.title} - ReDoc",
                    redoc_js_url=root + REDOC_JS,
                    redoc_favicon_url=root + FAVICON,
                    with_google_fonts=False,
                )
            )

        app.add_route(redoc_url, redoc, include_in_schema=False)


def _local_only(response: HTMLResponse) -> HTMLResponse:
    response.headers["Content-Security-Policy"] = LOCAL_ONLY
    return response


def _serves(route: BaseRoute, paths: set[str]) -> bool:
    return isinstance(route, Route) and route.path in paths


def _root_path(request: Request) -> str:
    root_path: str = request.scope.get("root_path", "")
    return root_path.rstrip("/")
