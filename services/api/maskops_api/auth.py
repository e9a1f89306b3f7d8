"""The token check: an ``Authorization: Bearer <token>`` header against the live API tokens.

The routes' dependency (:func:`maskops_api.deps.require`) and the job status fast path
(:mod:`maskops_api.middleware.status_shortcut`) both call :func:`check_token`. The fast path
reads the token cache only (``wait=False``): a token not in memory goes on to the app, whose
dependency reads its row and keeps it there.
"""

from __future__ import annotations

from fastapi.concurrency import run_in_threadpool

from maskops_api.cache.token_cache import TokenCache
from maskops_api.errors import Forbidden, Unauthorized
from maskops_api.services.tokens import allows
from maskops_core.db.models import TokenScope


def bearer_secret(authorization: str | None) -> str | None:
    """The token of an ``Authorization`` header value ``Bearer <token>`` (the scheme in any
    case, the token stripped of blanks), as FastAPI's ``HTTPBearer`` reads it; None for no
    header, another scheme or no token."""
    scheme, _, secret = (authorization or "").partition(" ")
    secret = secret.strip()
    return secret if scheme.lower() == "bearer" and secret else None


async def check_token(
    tokens: TokenCache, authorization: str | None, needed: TokenScope, *, wait: bool = True
) -> None:
    """Raise :class:`Unauthorized` (no token; unknown, revoked or expired) or
    :class:`Forbidden` (its scope is below ``needed``) unless the header's token is live
    with at least ``needed``. ``wait``: a token not in the cache has its row read (in the
    threadpool); without it, such a token is refused as unknown."""
    secret = bearer_secret(authorization)
    if secret is None:
        raise Unauthorized("an API token is required (Authorization: Bearer <token>)")
    granted = tokens.cached(secret)
    if granted is None and wait:
        granted = await run_in_threadpool(tokens.load, secret)
    if granted is None:
        raise Unauthorized("the API token is unknown, revoked or expired")
    if not allows(granted, needed):
        raise Forbidden(f"this token has scope {granted!r}; {needed.value!r} is needed")
