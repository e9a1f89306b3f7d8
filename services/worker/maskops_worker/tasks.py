"""Celery tasks: one per action, each taking a job id and wrapping :func:`run_job`.

Queues come from the catalogue through the app's ``task_routes`` (maskops_core.broker).
Reliability: acks_late + reject_on_worker_lost (a message is acknowledged only once its job
ended), soft/hard time limits from the settings, and automatic retries for broker/database
connection errors only; any other failure is recorded on the job by ``run_job``.
"""

from __future__ import annotations

from typing import Any

from kombu.exceptions import OperationalError as BrokerOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import OperationalError as DatabaseOperationalError

from maskops_core.actions import TRAIN_NODE_TASK, JobAction
from maskops_worker.celery_app import app
from maskops_worker.runner import run_job, run_node

RETRYABLE: tuple[type[BaseException], ...] = (
    BrokerOperationalError,
    RedisConnectionError,
    DatabaseOperationalError,
)


def _register(action: JobAction) -> Any:
    def task(job_id: int) -> str:
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
def train_node(job_id: int, attempt: int, endpoint: str) -> str:
    """One more node of a multi-node train job (see :func:`run_node`)."""
    return run_node(job_id, attempt, endpoint)
