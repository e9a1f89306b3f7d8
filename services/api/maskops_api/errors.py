"""API errors and the handlers that turn every kind of bad input into a 4xx with a message."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.routing import Match

from maskops.spec.errors import SpecError
from maskops_api.schemas import ErrorOut
from maskops_core.paths import DISK_FULL_ERRNOS, free_bytes
from maskops_core.settings import Settings

log = logging.getLogger(__name__)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": description}
    for code, description in (
        (401, "No API token, or an unknown, revoked or expired one"),
        (403, "The token's scope does not allow this"),
        (404, "No such resource"),
        (409, "The resource's state does not allow this"),
        (413, "The request body is larger than this route accepts (refused as it arrives)"),
        (422, "Invalid input; the message names the field (and line, for TAO text specs)"),
        (
            503,
            "A dependency (the database, Triton) is unavailable, or every database "
            "connection is busy (with Retry-After)",
        ),
    )
}
"""Every resource route may answer these, always as ``{"detail": "..."}``."""

RETRY_AFTER_S = "1"
"""``Retry-After`` of a 429 or of a 503 for a busy database pool, in seconds."""


class ApiError(Exception):
    status_code = 400

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class NotFound(ApiError):
    status_code = 404


class Conflict(ApiError):
    status_code = 409


class Invalid(ApiError):
    status_code = 422


class Unauthorized(ApiError):
    status_code = 401


class Forbidden(ApiError):
    status_code = 403


class TooLarge(ApiError):
    status_code = 413


class TooMany(ApiError):
    """429 with ``Retry-After``: a bounded resource (log streams) is all taken."""

    status_code = 429


class InsufficientStorage(ApiError):
    status_code = 507


def disk_full(exc: OSError, settings: Settings) -> InsufficientStorage | None:
    """The 507 for a write refused for lack of space, naming the disk; None for other
    errors."""
    if exc.errno not in DISK_FULL_ERRNOS:
        return None
    free = free_bytes(settings.data_root)
    return InsufficientStorage(
        f"no space left on the data root's disk (MASKOPS_DATA_ROOT, {free // 1024**2} MiB "
        "free); nothing of this request was kept"
    )


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        if error.get("type") == "json_invalid":
            # FastAPI's loc is ("body", <character position>): "9: JSON decode error" read
            # as a field named 9.
            reason = (error.get("ctx") or {}).get("error", "JSON decode error")
            parts.append(f"body: not valid JSON ({reason} at character {error['loc'][-1]})")
            continue
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        msg = _error_msg(error)
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"


def _error_msg(error: Any) -> str:
    msg = str(error.get("msg", "invalid"))
    if "Expected UploadFile, received" in msg:
        # A form field sent as text where a file part is needed (curl -F images=a.jpg,
        # without the @); FastAPI's message names a Python class.
        return "a file is expected, not text"
    return msg


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = dict(exc.headers)
        if isinstance(exc, Unauthorized):
            headers["WWW-Authenticate"] = "Bearer"
        elif isinstance(exc, TooMany):
            headers["Retry-After"] = RETRY_AFTER_S
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {"detail": _validation_message(exc), "errors": _jsonable(exc)}, status_code=422
        )

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):
            # FastAPI's "error parsing the body" for a body json.loads refused outright
            # (not UTF-8, nested too deeply): invalid input like any other bad JSON.
            return JSONResponse({"detail": _unparsable(exc.__cause__)}, status_code=422)
        if exc.status_code == 400 and isinstance(exc.__context__, MultiPartException):
            # Starlette's 400 for a form it could not parse (POST /infer): undocumented,
            # where the limits are a 413 and a malformed body a 422, as for the upload.
            return _unparsable_form(exc.__context__.message)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(DataError)
    async def _bad_value(_: Request, exc: DataError) -> JSONResponse:
        # The database refused a value the schema let through (a NUL byte in a string).
        first = str(exc.orig).splitlines()[0] if exc.orig else "invalid value"
        return JSONResponse({"detail": f"invalid value: {first}"}, status_code=422)

    @app.exception_handler(IntegrityError)
    async def _conflicting_write(_: Request, exc: IntegrityError) -> JSONResponse:
        # A row this write refers to went away meanwhile (deleted by another request), or a
        # concurrent write took the same key: the state changed, so 409 and retry.
        log.info("integrity error answered 409: %s", exc.orig)
        return JSONResponse(
            {"detail": "a resource this request refers to changed meanwhile; try again"},
            status_code=409,
        )

    @app.exception_handler(PoolTimeout)
    async def _pool_exhausted(_: Request, exc: PoolTimeout) -> JSONResponse:
        # Every pooled connection stayed taken for database_pool_timeout_s: a load peak,
        # not a fault of the request; the client may retry shortly.
        log.warning("database pool exhausted: %s", exc)
        return JSONResponse(
            {"detail": "the database is busy (every connection is in use); retry shortly"},
            status_code=503,
            headers={"Retry-After": RETRY_AFTER_S},
        )

    @app.exception_handler(OSError)
    async def _os_error(request: Request, exc: OSError) -> JSONResponse:
        full = disk_full(exc, request.app.state.settings)
        if full is None:  # as Starlette answers any other unhandled exception
            log.error("unhandled error", exc_info=exc)
            return JSONResponse({"detail": "Internal Server Error"}, status_code=500)
        log.error("disk full: %s", full.detail)
        return JSONResponse({"detail": full.detail}, status_code=507)

    @app.exception_handler(OperationalError)
    async def _database_down(_: Request, exc: OperationalError) -> JSONResponse:
        log.error("database unavailable: %s", exc)
        return JSONResponse({"detail": "database unavailable"}, status_code=503)


_FORM_LIMITS = ("Too many ", " exceeded maximum size ")
"""What Starlette's form parser says when a form passes its limits (files, fields, part
size), rather than being malformed."""


def _unparsable_form(message: str) -> JSONResponse:
    if any(limit in message for limit in _FORM_LIMITS):
        return JSONResponse({"detail": f"form too large: {message}"}, status_code=413)
    return JSONResponse({"detail": f"malformed multipart body: {message}"}, status_code=422)


def _unparsable(cause: BaseException) -> str:
    if isinstance(cause, UnicodeDecodeError):
        return "body: not valid JSON (it must be UTF-8)"
    if isinstance(cause, RecursionError):
        return "body: not valid JSON (nested too deeply)"
    return "body: not valid JSON"


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route answers at this path (Starlette names only the first
    matching route's, so ``/datasets`` said ``Allow: POST`` though GET works too)."""
    # Asked of the router per method: routes may be nested (included routers), and only
    # the router knows which of them answers a method fully.
    allowed = []
    for method in ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT"):
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


def _jsonable(exc: RequestValidationError) -> list[dict[str, object]]:
    return [{"loc": [str(p) for p in e.get("loc", ())], "msg": _error_msg(e)} for e in exc.errors()]
