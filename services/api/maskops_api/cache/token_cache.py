"""Verified API tokens kept in memory, so that a request's token check needs no query.

With auth required every request checks its bearer token; reading the ``api_tokens`` row
each time cost a database round trip per request. A token found live is kept here (by its
SHA-256, with its scope) for at most ``ttl_s`` and never past its ``expires_at``. Migration
0003 makes Postgres send ``NOTIFY maskops_token_changed, '<schema>:<token hash>'`` when a
token row changes or goes (revocation, from any process: ``maskops token revoke``, another
API), ``'<schema>:*'`` on truncate; the job cache's listener connection
(:meth:`maskops_api.cache.job_cache.JobCache.subscribe`) passes them here and the entry is
dropped: revocation takes effect in every API process within the notification's delay.

Memory is trusted only while that listener is connected: when it is down, or on SQLite
(the embedded default, no notifications), every check reads the database. Unknown tokens
are never kept (each try of a wrong token reads the database, as before).

A token in use is read again in the background once half its ``ttl_s`` has passed, while
its checks go on being answered from memory: when the entry simply ran out, every client
polling with that token at that moment read the database at once (84 reads over 50
clients' 180,000 polls in bench/bench_api.py, each through the full route).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import NamedTuple

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.services.tokens import find_token, hash_token
from maskops_core.db.models import utcnow

log = logging.getLogger(__name__)

CHANNEL = "maskops_token_changed"


class _Entry(NamedTuple):
    scope: str
    until: float  # monotonic: the entry's end (never past the token's expiry)
    refresh_at: float  # monotonic: from here a check also has the row read again


class TokenCache:
    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        schema: str | None,
        ttl_s: float = 30.0,
        max_entries: int = 10_000,
    ):
        self._factory = factory
        self._schema = schema or "public"
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._live = False
        # Bumped by every change notification: a read that started before one may have
        # seen the row as it was, and must not be kept.
        self._generation = 0
        self._refreshing: set[str] = set()
        self._refresher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="token-refresh")
        self.hits = 0
        self.misses = 0  # checks that read the database (also a wrong or new token)
        self.refreshes = 0  # background reads of tokens in use

    def cached(self, secret: str) -> str | None:
        """The scope of a token verified moments ago; None when it must be read (never
        touches the database, so the event loop may call it)."""
        digest = hash_token(secret)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(digest) if self._live else None
            if entry is None or now >= entry.until:
                return None
            self.hits += 1
            refresh = now >= entry.refresh_at and digest not in self._refreshing
            if refresh:
                self._refreshing.add(digest)
        if refresh:
            try:
                self._refresher.submit(self._refresh, digest, secret)
            except RuntimeError:  # closed (the app stops): the entry just runs out
                with self._lock:
                    self._refreshing.discard(digest)
        return entry.scope

    def load(self, secret: str) -> str | None:
        """The live token's scope read from the database (blocking) and kept; None for an
        unknown, revoked or expired token."""
        with self._lock:
            self.misses += 1
        return self._read(hash_token(secret), secret)

    def _refresh(self, digest: str, secret: str) -> None:
        try:
            self._read(digest, secret)
        except SQLAlchemyError as exc:  # the entry runs out, and the next check reads it
            log.warning("token cache: reading a token in use again failed (%s)", exc)
        finally:
            with self._lock:
                self._refreshing.discard(digest)
                self.refreshes += 1

    def _read(self, digest: str, secret: str) -> str | None:
        with self._lock:
            generation = self._generation
        with self._factory() as session:
            token = find_token(session, secret)
            if token is None:
                with self._lock:
                    self._entries.pop(digest, None)
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
            self._entries[digest] = _Entry(scope, until, now + self._ttl_s / 2)

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

    def close(self) -> None:
        """Stop reading tokens in the background (the app's shutdown)."""
        self._refresher.shutdown(wait=True, cancel_futures=True)

    def set_live(self, live: bool) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()
            self._live = live
