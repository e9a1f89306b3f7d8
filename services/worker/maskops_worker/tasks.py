"""Celery tasks: one per action, each taking a job id and wrapping :func:`run_job`.

Queues come from the catalogue through the app's ``task_routes`` (maskops_core.broker).
Reliability: acks_late + reject_on_worker_lost (a message is acknowledged only once its job
ended), soft/hard time limits from the settings, and automatic retries for broker/database
connection errors only; any other failure is recorded on the job by ``run_job``.

Every message names the stack that sent it (``settings.stack_id``). A worker runs only its
own stack's: another stack's message (stacks sharing a broker with the same queue names)
goes back to the broker unacknowledged, for that stack's workers, instead of being taken
for a job of this database (a job of another database whose id this one lacks was acked
and lost; one whose id it holds ran this database's job instead).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.exceptions import Reject
from kombu.exceptions import OperationalError as BrokerOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import OperationalError as DatabaseOperationalError

from maskops_core.actions import TRAIN_NODE_TASK, JobAction
from maskops_core.settings import get_settings
from maskops_worker.celery_app import app
from maskops_worker.runner import run_job, run_node

log = logging.getLogger(__name__)

FOREIGN_REQUEUE_DELAY_S = 1.0
"""Pause before another stack's message goes back (its own workers take it meanwhile; a
worker does not spin on it)."""

RETRYABLE: tuple[type[BaseException], ...] = (
    BrokerOperationalError,
    RedisConnectionError,
    DatabaseOperationalError,
)


def check_stack(job_id: int, stack: str) -> None:
    """Raise ``Reject(requeue=True)`` for a message another stack sent."""
    own = get_settings().stack_id
    if stack == own:
        return
    log.warning(
        "job %s: the message is stack %r's, this worker serves %r; back to the broker",
        job_id,
        stack,
        own,
    )
    time.sleep(FOREIGN_REQUEUE_DELAY_S)
    raise Reject(f"stack {stack!r}'s message", requeue=True)


def _register(action: JobAction) -> Any:
    def task(job_id: int, stack: str = "") -> str:
        check_stack(job_id, stack)
        return run_job(job_id)

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
def train_node(job_id: int, attempt: int, endpoint: str, stack: str = "") -> str:
    """One more node of a multi-node train job (see :func:`run_node`)."""
    check_stack(job_id, stack)
    return run_node(job_id, attempt, endpoint)
