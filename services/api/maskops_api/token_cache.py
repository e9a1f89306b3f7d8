"""Verified API tokens kept in memory, so that a request's token check needs no query.

With auth required every request checks its bearer token; reading the ``api_tokens`` row
each time cost a database round trip per request. A token found live is kept here (by its
SHA-256, with its scope) for at most ``ttl_s`` and never past its ``expires_at``. Migration
0003 makes Postgres send ``NOTIFY maskops_token_changed, '<schema>:<token hash>'`` when a
token row changes or goes (revocation, from any process: ``maskops token revoke``, another
API), ``'<schema>:*'`` on truncate; the job cache's listener connection
(:meth:`maskops_api.job_cache.JobCache.subscribe`) passes them here and the entry is
dropped: revocation takes effect in every API process within the notification's delay.

Memory is trusted only while that listener is connected: when it is down, or on SQLite
(the embedded default, no notifications), every check reads the database. Unknown tokens
are never kept (each try of a wrong token reads the database, as before).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from maskops_api.services.tokens import find_token, hash_token
from maskops_core.db.models import utcnow

CHANNEL = "maskops_token_changed"


class TokenCache:
    def __init__(self, *, schema: str | None, ttl_s: float = 30.0, max_entries: int = 10_000):
        self._schema = schema or "public"
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._entries: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._live = False
        # Bumped by every change notification: a read that started before one may have
        # seen the row as it was, and must not be kept.
        self._generation = 0
        self.hits = 0
        self.misses = 0  # checks that read the database (also a wrong or new token)

    def cached(self, secret: str) -> str | None:
        """The scope of a token verified moments ago; None when it must be read (never
        touches the database, so the event loop may call it)."""
        digest = hash_token(secret)
        with self._lock:
            entry = self._entries.get(digest) if self._live else None
            if entry is None or time.monotonic() >= entry[1]:
                return None
            self.hits += 1
            return entry[0]

    def load(self, factory: sessionmaker[Session], secret: str) -> str | None:
        """The live token's scope read from the database (blocking) and kept; None for an
        unknown, revoked or expired token."""
        digest = hash_token(secret)
        with self._lock:
            generation = self._generation
            self.misses += 1
        with factory() as session:
            token = find_token(session, secret)
            if token is None:
                return None
            scope, expires_at = str(token.scope), token.expires_at
        self._keep(digest, scope, expires_at, generation)
        return scope

    def _keep(self, digest: str, scope: str, expires_at: datetime | None, generation: int) -> None:
        now = time.monotonic()
        until = now + self._ttl_s
        if expires_at is not None:
            # The monotonic instant of the expiry: the entry never outlives the token.
            until = min(until, now + (expires_at - utcnow()).total_seconds())
        with self._lock:
            if not self._live or generation != self._generation:
                return
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
            self._entries[digest] = (scope, until)

    def notified(self, payload: str) -> None:
        schema, _, digest = payload.rpartition(":")
        if schema != self._schema:
            return
        with self._lock:
            self._generation += 1
            if digest == "*":
                self._entries.clear()
            else:
                self._entries.pop(digest, None)

    def set_live(self, live: bool) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()
            self._live = live
