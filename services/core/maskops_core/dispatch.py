"""Sending jobs to the broker, the one rule for everything that sends one: the API (a new
job, a resumed one, the reconciler's re-sends) and a search's controller in the worker (its
trials). The database row is written first; a message that cannot be sent (broker down)
leaves the job queued, for the reconciler (or the controller's next pass) to send later."""

from __future__ import annotations

import logging
from typing import Protocol

from celery import Celery
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from maskops_core import automl as searches
from maskops_core.actions import JobAction, dispatch_task_id, stack_kwargs
from maskops_core.broker import make_celery
from maskops_core.db.models import Job, utcnow
from maskops_core.db.session import transaction
from maskops_core.identity import database_identity
from maskops_core.settings import Settings

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    def send(self, *, action: str, job_id: int, queue: str, task_id: str, database: str) -> None:
        """Send job ``job_id``'s message; ``database``: the identity of the database
        holding the job (:mod:`maskops_core.identity`)."""


class CeleryDispatcher:
    """Publishes the action's task (by name: the API never imports the worker) on the
    job's queue, naming this stack (``settings.stack_id``).

    ``app``: the Celery app to send with (a worker's own, which the worker keeps and
    closes); without it, one of its own that gives up on a broker that is down after a
    few seconds, so that a request never waits on it."""

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self.stack_id = settings.stack_id
        self.max_running_searches = settings.max_running_searches
        self._owns_app = app is None
        if app is None:
            app = make_celery(settings)
            app.conf.broker_connection_timeout = 3
            app.conf.broker_connection_max_retries = 1
        self.app: Celery = app

    def send(self, *, action: str, job_id: int, queue: str, task_id: str, database: str) -> None:
        self.app.send_task(
            JobAction.named(action).task_name,
            args=[job_id],
            kwargs=stack_kwargs(self.stack_id, database),
            queue=queue,
            task_id=task_id,
            retry=False,
        )

    def close(self) -> None:
        if self._owns_app:
            self.app.close()


def dispatch_job(factory: sessionmaker[Session], dispatcher: Dispatcher, job: Job) -> bool:
    """Send a message for a queued job and record it; False if the broker refused, or if
    the job is a search and ``max_running_searches`` others hold their slots (it stays
    queued and unsent: the reconciler's passes send it once one ends)."""
    limit = getattr(dispatcher, "max_running_searches", None)
    if job.action == JobAction.automl and not searches.may_send_search(factory, job.id, limit):
        log.info("job %s: %s searches already run; it waits, queued", job.id, limit)
        return False
    attempt = job.dispatch_count + 1
    task_id = dispatch_task_id(job.id, attempt)
    database = database_identity(factory)
    try:
        dispatcher.send(
            action=job.action, job_id=job.id, queue=job.queue, task_id=task_id, database=database
        )
    except Exception as exc:
        log.warning("job %s: could not reach the broker (%s); will retry", job.id, exc)
        return False
    now = utcnow()
    # Recorded whatever the job's status is by now: a worker may already have claimed it.
    # Unrecorded, the next message for the job would reuse this one's task id, and a search
    # controller would take its trial for unsent and send it again.
    with transaction(factory) as session:
        session.execute(
            update(Job)
            .where(Job.id == job.id)
            .values(dispatch_count=attempt, dispatched_at=now, task_id=task_id)
        )
    job.dispatch_count, job.dispatched_at, job.task_id = attempt, now, task_id
    return True
