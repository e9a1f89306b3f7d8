"""Celery tasks: one per action, each taking a job id and wrapping :func:`run_job`.

Queues come from the catalogue through the app's ``task_routes`` (maskops_core.broker).
Reliability: acks_late + reject_on_worker_lost (a message is acknowledged only once its job
ended), soft/hard time limits from the settings, and automatic retries for broker/database
connection errors only; any other failure is recorded on the job by ``run_job``.

Every message names the stack that sent it (``settings.stack_id``) and the database that
holds its job (:mod:`maskops_core.identity`). A worker runs only its own: another stack's
or another database's message (stacks sharing a broker with the same queue names, such as
two stacks left without a stack id on one Redis database) goes back to the broker
unacknowledged, for that stack's workers, instead of being taken for a job of this
database (a job of another database whose id this one lacks was acked and lost; one whose
id it holds ran this database's job instead).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.exceptions import Reject

from maskops_core.actions import TRAIN_NODE_TASK, JobAction
from maskops_core.identity import database_identity
from maskops_core.settings import get_settings
from maskops_worker import streak
from maskops_worker.celery_app import app
from maskops_worker.runner import run_job, run_node, session_factory

log = logging.getLogger(__name__)

FOREIGN_REQUEUE_DELAY_S = 1.0
"""Pause before another stack's message goes back (its own workers take it meanwhile; a
worker does not spin on it)."""

RETRYABLE = streak.INFRASTRUCTURE_ERRORS


def check_origin(job_id: int, stack: str, database: str) -> None:
    """Raise ``Reject(requeue=True)`` for a message another stack sent, or one whose job
    another database holds (messages from before databases were named carry none)."""
    settings = get_settings()
    if stack != settings.stack_id:
        why = f"the message is stack {stack!r}'s, this worker serves {settings.stack_id!r}"
    elif database and database != database_identity(session_factory(settings)):
        why = (
            f"the message is database {database}'s, not this worker's: stacks on one broker "
            "share queue names (give each its own MASKOPS_STACK_ID)"
        )
    else:
        return
    log.warning("job %s: %s; back to the broker", job_id, why)
    time.sleep(FOREIGN_REQUEUE_DELAY_S)
    raise Reject(why, requeue=True)


def _register(action: JobAction) -> Any:
    def task(job_id: int, stack: str = "", database: str = "") -> str:
        try:
            check_origin(job_id, stack, database)
            return run_job(job_id)
        except RETRYABLE as exc:  # its database or broker refused this worker
            streak.task_ended(exc)
            raise

    task.__name__ = action.value
    task.__qualname__ = action.value
    return app.task(
        name=action.task_name,
        acks_late=True,
        reject_on_worker_lost=True,
        autoretry_for=RETRYABLE,
        retry_backoff=True,
        retry_backoff_max=60,
        max_retries=10,
    )(task)


TASKS = {action.value: _register(action) for action in JobAction}


@app.task(name=TRAIN_NODE_TASK, acks_late=True, autoretry_for=RETRYABLE, max_retries=10)
def train_node(
    job_id: int, attempt: int, endpoint: str, stack: str = "", database: str = ""
) -> str:
    """One more node of a multi-node train job (see :func:`run_node`)."""
    check_origin(job_id, stack, database)
    return run_node(job_id, attempt, endpoint)
