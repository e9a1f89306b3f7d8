"""``Annotated`` dependencies: settings, a database session, the dispatcher, and auth."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Header, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.auth import check_token
from maskops_api.cache.job_cache import JobCache
from maskops_api.cache.token_cache import TokenCache
from maskops_api.in_flight import KeysInFlight
from maskops_api.schemas import MAX_ID
from maskops_core.db.models import TokenScope
from maskops_core.dispatch import Dispatcher
from maskops_core.settings import Settings


# The plain attribute reads below are ``async`` so that FastAPI calls them inline instead
# of sending each one through the threadpool: that hop cost more than the status query.
async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.session_factory
    return factory


def get_session(
    factory: Annotated[sessionmaker[Session], Depends(get_factory)],
) -> Iterator[Session]:
    with factory() as session:
        yield session


async def get_dispatcher(request: Request) -> Dispatcher:
    dispatcher: Dispatcher = request.app.state.dispatcher
    return dispatcher


async def get_job_cache(request: Request) -> JobCache:
    cache: JobCache = request.app.state.job_cache
    return cache


async def get_keys_in_flight(request: Request) -> KeysInFlight:
    keys: KeysInFlight = request.app.state.keys_in_flight
    return keys


SettingsDep = Annotated[Settings, Depends(get_settings)]
FactoryDep = Annotated[sessionmaker[Session], Depends(get_factory)]
SessionDep = Annotated[Session, Depends(get_session)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]
JobCacheDep = Annotated[JobCache, Depends(get_job_cache)]
KeysInFlightDep = Annotated[KeysInFlight, Depends(get_keys_in_flight)]
IdempotencyKeyDep = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=200,
        description="Retrying a POST with the same key returns the first request's resource.",
    ),
]

JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
DatasetId = Annotated[int, Path(ge=1, le=MAX_ID)]
ExperimentId = Annotated[int, Path(ge=1, le=MAX_ID)]

_bearer = HTTPBearer(auto_error=False, description="An API token from `maskops token create`.")


def require(scope: TokenScope) -> Callable[..., Awaitable[None]]:
    """A dependency demanding a live token of at least ``scope`` when auth is required
    (:func:`maskops_api.auth.check_token`)."""

    async def check(
        request: Request,
        _scheme: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> None:
        # ``_scheme`` declares the bearer scheme in the OpenAPI document; the header itself
        # is read by check_token, as the status fast path reads it. async, and reading
        # app.state directly rather than through sub-dependencies, so that loopback
        # deployments (no auth) pay next to nothing per request.
        settings: Settings = request.app.state.settings
        if not settings.auth_required:
            return
        tokens: TokenCache = request.app.state.token_cache
        await check_token(tokens, request.headers.get("authorization"), scope)

    return check


ReadAccess = Depends(require(TokenScope.read))
WriteAccess = Depends(require(TokenScope.write))
AdminAccess = Depends(require(TokenScope.admin))
