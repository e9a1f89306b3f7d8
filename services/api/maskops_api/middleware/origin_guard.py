"""Requests from pages of other origins, and requests by a name the server does not serve,
are refused before any route runs (pure ASGI middleware, outermost).

On loopback without tokens the only thing between a web page the operator visits and the
API is the browser; two attacks go through it:

- Cross-site request forgery: a page of another origin (another site, or another port of
  127.0.0.1) posts a form or calls ``fetch`` to ``http://127.0.0.1:8080``. The browser
  sends the request (only reading the answer needs CORS), so writes must be refused by the
  server. Browsers name the page's origin in ``Origin`` on every cross-origin request but
  a navigation, and say how it relates to the target in ``Sec-Fetch-Site``.
- DNS rebinding: a name the attacker controls first resolves to their server, then to
  127.0.0.1; the page is then same-origin with the API *by name* and may read every
  answer. The ``Host`` header still carries the attacker's name, so it must be one the
  server serves (:func:`served_hosts`).

Rules, in order:

1. ``Host`` (without its port) must be a served name: 400.
2. A request whose ``Origin`` is neither the server's own (its host and port are
   ``Host``) nor one of ``MASKOPS_CORS_ORIGINS`` is refused: 403. Clients that are no
   browser send no ``Origin`` and are not concerned.
3. A request without ``Origin`` that a browser marks ``Sec-Fetch-Site: cross-site`` or
   ``same-site`` (another port) is refused unless it is a top-level navigation
   (``Sec-Fetch-Mode: navigate`` with ``GET``/``HEAD``: following a link to ``/ui``):
   it would read JSON without CORS consent, or write (403).

Origins in ``MASKOPS_CORS_ORIGINS`` get CORS headers (Starlette's ``CORSMiddleware``, added
inside this one), which is how an operator consents to another origin's page reading or
writing.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from maskops_core.settings import Settings, is_loopback

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""Names a loopback server is always reached by."""
_SAFE_METHODS = frozenset({"GET", "HEAD"})
_OTHER_SITE = frozenset({"cross-site", "same-site"})


def served_hosts(settings: Settings) -> frozenset[str] | None:
    """The host names (lower case, no port, IPv6 without brackets) requests may carry in
    ``Host``; ``None`` = any (a server bound beyond loopback with no
    ``MASKOPS_ALLOWED_HOSTS``: it requires tokens, which no browser sends by itself)."""
    extra = {name.lower().strip("[]") for name in settings.allowed_hosts}
    if is_loopback(settings.host):
        return frozenset({*LOOPBACK_NAMES, settings.host.lower().strip("[]"), *extra})
    return frozenset({settings.host.lower().strip("[]"), *extra}) if extra else None


def host_name(host: str) -> str:
    """``host`` of a ``Host`` header without its port (``[::1]:8080`` -> ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class OriginGuard:
    def __init__(self, app: ASGIApp, *, settings: Settings) -> None:
        self.app = app
        self.hosts = served_hosts(settings)
        self.cors_origins = frozenset(o.rstrip("/").lower() for o in settings.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self.refusal(scope, headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, detail = refusal
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        """``(status, detail)`` when the request must be refused, else ``None``."""
        host = headers.get("host", "")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return 400, (f"Host {host!r} is not a name this server serves (MASKOPS_ALLOWED_HOSTS)")
        origin = headers.get("origin")
        if origin is not None:
            # The page's host and port are this server's (its scheme may differ behind a
            # proxy that ends TLS: one host and port serve one origin either way).
            if origin.lower().partition("://")[2] == host.lower() or (
                origin.rstrip("/").lower() in self.cors_origins
            ):
                return None
            return 403, (
                f"cross-origin request from {origin!r} refused "
                "(allow an origin with MASKOPS_CORS_ORIGINS)"
            )
        site = headers.get("sec-fetch-site", "").lower()
        navigation = (
            headers.get("sec-fetch-mode", "").lower() == "navigate"
            and scope["method"] in _SAFE_METHODS
        )
        if site in _OTHER_SITE and not navigation:
            return 403, f"a {site} request without CORS consent refused"
        return None
