"""Job rows kept in memory for status polls, dropped the moment Postgres says they changed.

Clients poll ``GET /jobs/{id}`` far more often than a job changes. Migration 0002 makes
Postgres send ``NOTIFY maskops_job_changed, '<schema>:<id>'`` on every change to a job
row (``'<schema>:*'`` on truncate), whoever wrote it: the API, a worker, the reconciler.
A listener thread re-reads each changed row that is in memory (dropping deleted ones) as
the notifications arrive, batched into one query: clients following a job keep being
answered from memory, and an answer is never older than the last commit by more than the
notification and that one read take (milliseconds). Rows are kept with their JSON answer,
rendered off the event loop when read; a running job's answer (its ETA moves with the
clock) is rendered again when it is older than ``ETA_MAX_AGE``. The API's own writes
(cancel, resume) drop the row at once, so a client sees its own change on its next poll.
The database stays the source of truth.

The cache serves only while its listener is connected: a lost connection may have lost
notifications, so it empties and stays off until the listener is back. SQLite (the
embedded default) has no notifications; there every poll reads the database.

The same listener connection serves other in-memory caches (:meth:`JobCache.subscribe`:
the verified API tokens of :mod:`maskops_api.cache.token_cache`), so that one mechanism decides
for all of them when memory may be trusted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.to_thread
import psycopg
from sqlalchemy import Engine, make_url, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from maskops_api.services.jobs import eta_depends_on_time, get_job, job_json
from maskops_core.db.models import Job

log = logging.getLogger(__name__)

CHANNEL = "maskops_job_changed"
ETA_MAX_AGE = 0.25
"""Seconds a running job's rendered answer (its ETA) is served before it is rendered again."""


class Subscriber(Protocol):
    """Another cache fed by the job cache's notification connection."""

    def notified(self, payload: str) -> None:
        """A notification on the subscribed channel arrived."""

    def set_live(self, live: bool) -> None:
        """The connection came up (serve from memory) or went down (empty, and stop)."""


@dataclass(slots=True)
class _Entry:
    job: Job
    body: bytes
    rendered_at: float
    ages: bool  # the body changes with the clock alone

    @classmethod
    def of(cls, job: Job) -> _Entry:
        return cls(job, job_json(job), time.monotonic(), eta_depends_on_time(job))


class JobCache:
    """Read-through cache of detached ``Job`` rows, invalidated by Postgres notifications."""

    def __init__(
        self,
        engine: Engine,
        *,
        schema: str | None,
        max_entries: int = 50_000,
        max_concurrent_reads: int = 8,
    ) -> None:
        # A single SELECT needs no transaction: autocommit spares the BEGIN and ROLLBACK
        # round trips around it.
        self._factory = sessionmaker(
            engine.execution_options(isolation_level="AUTOCOMMIT"), expire_on_commit=False
        )
        self._listens = engine.dialect.name == "postgresql"
        url = make_url(engine.url).set(drivername="postgresql")
        self._dsn = url.render_as_string(hide_password=False)
        self._schema = schema or "public"
        self._max_entries = max_entries
        self._rows: OrderedDict[int, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        # A token per read in flight; an invalidation of that job removes it, and a read
        # whose token is gone raced a change and must not be stored.
        self._reading: dict[int, object] = {}
        self._live = False
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None
        # Fewer concurrent reads than pooled connections: beyond the pool, every read
        # opens (and closes) a Postgres connection, which costs more than the read.
        self._max_concurrent_reads = max_concurrent_reads
        self._read_limiter: anyio.CapacityLimiter | None = None
        self.hits = 0
        self.misses = 0
        self._subscribers: dict[str, Subscriber] = {}

    @property
    def live(self) -> bool:
        return self._live

    @property
    def listens(self) -> bool:
        """Whether this database sends notifications at all (Postgres, not SQLite)."""
        return self._listens

    def subscribe(self, channel: str, subscriber: Subscriber) -> None:
        """Also LISTEN on ``channel`` and pass its notifications on (before :meth:`start`)."""
        self._subscribers[channel] = subscriber

    def start(self) -> None:
        if not self._listens or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._listen, name="job-cache", daemon=True)
        self._thread.start()

    def wait_live(self, timeout: float) -> bool:
        """Block until the listener is connected (tests, startup); whether it is."""
        return self._connected.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    async def fetch_body(self, job_id: int) -> bytes:
        """The job's JSON answer, from memory when possible; raises ``NotFound`` for an
        unknown id."""
        body = self.body(job_id)
        if body is not None:
            return body
        return await anyio.to_thread.run_sync(self.load, job_id, limiter=self._limiter())

    def body(self, job_id: int) -> bytes | None:
        """The job's JSON answer if it is in memory and the cache is live; never touches
        the database."""
        with self._lock:
            entry = self._rows.get(job_id) if self._live else None
            if entry is None:
                return None
            self._rows.move_to_end(job_id)
            self.hits += 1
            now = time.monotonic()
            if not entry.ages or now - entry.rendered_at < ETA_MAX_AGE:
                return entry.body
            job = entry.job
        body = job_json(job)
        with self._lock:
            if self._rows.get(job_id) is entry:
                entry.body, entry.rendered_at = body, now
        return body

    async def fetch_status(self, job_id: int) -> str:
        """The job's status, from memory when possible, else in one short read (bounded
        like every read of this cache); raises ``NotFound`` for an unknown id. Log
        followers ask this every half second: on Postgres they are answered from memory,
        kept fresh by the notifications; on SQLite each check takes a connection only for
        its read."""
        with self._lock:
            entry = self._rows.get(job_id) if self._live else None
        if entry is not None:
            return entry.job.status
        loaded = await anyio.to_thread.run_sync(self._load_entry, job_id, limiter=self._limiter())
        return loaded.job.status

    def _limiter(self) -> anyio.CapacityLimiter:
        if self._read_limiter is None:  # created here: it needs the running event loop
            self._read_limiter = anyio.CapacityLimiter(self._max_concurrent_reads)
        return self._read_limiter

    def load(self, job_id: int) -> bytes:
        """Read the row from the database (blocking), keep it unless it changed meanwhile,
        and return its JSON answer. Raises ``NotFound`` for an unknown id."""
        return self._load_entry(job_id).body

    def _load_entry(self, job_id: int) -> _Entry:
        token = object()
        with self._lock:
            self._reading[job_id] = token
            self.misses += 1
        entry: _Entry | None = None
        try:
            with self._factory() as session:
                entry = _Entry.of(get_job(session, job_id))
            return entry
        finally:
            with self._lock:
                if self._reading.get(job_id) is token:
                    del self._reading[job_id]
                    if entry is not None and self._live:
                        self._rows[job_id] = entry
                        if len(self._rows) > self._max_entries:
                            self._rows.popitem(last=False)

    def forget(self, job_id: int) -> None:
        """Drop a job the API itself just changed, so the next poll reads the database
        even if its notification has not arrived yet (read-your-writes)."""
        with self._lock:
            self._rows.pop(job_id, None)
            self._reading.pop(job_id, None)

    def _apply(self, payload: str) -> set[int]:
        """Act on one notification; the cached ids that must be read again."""
        schema, _, key = payload.rpartition(":")
        if schema != self._schema:
            return set()
        with self._lock:
            if key == "*":
                self._rows.clear()
                self._reading.clear()
                return set()
            if not key.isdigit():
                return set()
            job_id = int(key)
            self._reading.pop(job_id, None)
            return {job_id} if job_id in self._rows else set()

    def _route(self, notification: psycopg.Notify) -> set[int]:
        subscriber = self._subscribers.get(notification.channel)
        if subscriber is not None:
            subscriber.notified(notification.payload)
            return set()
        return self._apply(notification.payload)

    def _refresh(self, job_ids: set[int]) -> None:
        """Read changed cached rows again, from the listener thread, so that followed jobs
        stay in memory instead of every poll after a change going to the database."""
        try:
            with self._factory() as session:
                rows = session.scalars(select(Job).where(Job.id.in_(job_ids)))
                fresh = {job.id: _Entry.of(job) for job in rows}
        except SQLAlchemyError as exc:
            log.warning("job cache: re-reading %d changed jobs failed (%s)", len(job_ids), exc)
            fresh = {}
        with self._lock:
            for job_id in job_ids:
                entry = fresh.get(job_id)
                if entry is None:
                    self._rows.pop(job_id, None)
                elif job_id in self._rows:
                    self._rows[job_id] = entry

    def _set_live(self, live: bool) -> None:
        with self._lock:
            self._rows.clear()
            self._reading.clear()
            self._live = live
        for subscriber in self._subscribers.values():
            subscriber.set_live(live)
        if live:
            self._connected.set()
        else:
            self._connected.clear()

    def _listen(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True, connect_timeout=5) as conn:
                    # The job channel last: pg_stat_activity shows this connection by
                    # its last query, "LISTEN maskops_job_changed", as it always has.
                    for channel in (*self._subscribers, CHANNEL):
                        conn.execute(f"LISTEN {channel}")
                    self._set_live(True)
                    backoff = 0.5
                    while not self._stop.is_set():
                        changed: set[int] = set()
                        # Wait for one notification, then take what else has arrived, and
                        # re-read the whole batch in one query.
                        for notification in conn.notifies(timeout=1.0, stop_after=1):
                            changed |= self._route(notification)
                        for notification in conn.notifies(timeout=0.001):
                            changed |= self._route(notification)
                        if changed:
                            self._refresh(changed)
            except psycopg.Error as exc:
                log.warning("job cache off: lost the notification connection (%s)", exc)
            finally:
                self._set_live(False)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 10.0)
