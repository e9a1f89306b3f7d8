"""The Celery application both sides build: queues, routing and reliability settings.

The API produces messages by task name with it (it never imports the worker); the worker
builds the same app with its task module included. Routing comes from the action catalogue,
so producer and consumer cannot disagree on an action's queue.

GPU work and CPU work go to separate queues so they scale separately. A GPU worker runs one
job at a time (``--concurrency 1``, prefetch multiplier 1): a training job owns its GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery
from kombu import Queue

from maskops_core.actions import task_routes
from maskops_core.settings import Settings


def make_celery(settings: Settings, *, include: Sequence[str] = ()) -> Celery:
    """A Celery app for ``settings``; ``include`` names the task modules a consumer loads."""
    app = Celery("maskops", broker=settings.broker_url, include=list(include))
    app.conf.update(
        task_queues=[Queue(settings.gpu_queue), Queue(settings.cpu_queue)],
        task_default_queue=settings.cpu_queue,
        task_routes=task_routes(settings),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_soft_time_limit=settings.task_soft_time_limit_s,
        task_time_limit=settings.task_time_limit_s,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    if settings.broker_url.startswith(("redis://", "rediss://")):
        # A lost message is recovered by the reconciler (the database knows every job), not
        # by Redis' visibility timeout, so a long training job is never delivered twice by it.
        app.conf.broker_transport_options = {
            "visibility_timeout": 30 * 24 * 3600,
            # Stacks sharing a Redis never see each other's queues or unacked messages.
            "global_keyprefix": settings.broker_key_prefix,
        }
    return app
