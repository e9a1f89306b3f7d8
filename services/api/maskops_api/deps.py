"""``Annotated`` dependencies: settings, a database session, the dispatcher, and auth."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Header, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.cache.job_cache import JobCache
from maskops_api.cache.token_cache import TokenCache
from maskops_api.errors import Forbidden, Unauthorized
from maskops_api.in_flight import KeysInFlight
from maskops_api.schemas import MAX_ID
from maskops_api.services.tokens import allows
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
    """A dependency demanding a live token of at least ``scope`` when auth is required."""

    async def check(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> None:
        # async, and reading app.state directly rather than through sub-dependencies, so
        # that loopback deployments (no auth) pay next to nothing per request; the token
        # lookup itself is a blocking query and goes to the threadpool.
        settings: Settings = request.app.state.settings
        if not settings.auth_required:
            return
        if credentials is None:
            raise Unauthorized("an API token is required (Authorization: Bearer <token>)")
        tokens: TokenCache = request.app.state.token_cache
        granted = tokens.cached(credentials.credentials)
        if granted is None:
            granted = await run_in_threadpool(tokens.load, credentials.credentials)
        if granted is None:
            raise Unauthorized("the API token is unknown, revoked or expired")
        if not allows(granted, scope):
            raise Forbidden(f"this token has scope {granted!r}; {scope.value!r} is needed")

    return check


ReadAccess = Depends(require(TokenScope.read))
WriteAccess = Depends(require(TokenScope.write))
AdminAccess = Depends(require(TokenScope.admin))
