"""``Annotated`` dependencies: settings, a database session, the dispatcher, and auth."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Header, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.db.models import TokenScope
from maskops_api.dispatch import Dispatcher
from maskops_api.errors import Forbidden, Unauthorized
from maskops_api.schemas import MAX_ID
from maskops_api.services.tokens import allows, find_token
from maskops_api.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.session_factory
    return factory


def get_session(
    factory: Annotated[sessionmaker[Session], Depends(get_factory)],
) -> Iterator[Session]:
    with factory() as session:
        yield session


def get_dispatcher(request: Request) -> Dispatcher:
    dispatcher: Dispatcher = request.app.state.dispatcher
    return dispatcher


SettingsDep = Annotated[Settings, Depends(get_settings)]
FactoryDep = Annotated[sessionmaker[Session], Depends(get_factory)]
SessionDep = Annotated[Session, Depends(get_session)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]
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


def require(scope: TokenScope) -> Callable[..., None]:
    """A dependency demanding a live token of at least ``scope`` when auth is required."""

    def check(
        settings: SettingsDep,
        session: SessionDep,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> None:
        if not settings.auth_required:
            return
        if credentials is None:
            raise Unauthorized("an API token is required (Authorization: Bearer <token>)")
        token = find_token(session, credentials.credentials)
        if token is None:
            raise Unauthorized("the API token is unknown, revoked or expired")
        if not allows(token.scope, scope):
            raise Forbidden(f"this token has scope {token.scope!r}; {scope.value!r} is needed")

    return check


ReadAccess = Depends(require(TokenScope.read))
WriteAccess = Depends(require(TokenScope.write))
AdminAccess = Depends(require(TokenScope.admin))
