"""The Celery application: queues, reliability settings and task routing.

GPU work (train, evaluate, prune, inference, export) and CPU work (dataset_convert) go to
separate queues so they scale separately. A GPU worker runs one job at a time
(``--concurrency 1``, prefetch multiplier 1): a training job owns its GPU.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from celery import Celery
from celery.signals import worker_process_init
from kombu import Queue

from maskops_api.settings import Settings, get_settings

GPU_ACTIONS = frozenset({"train", "evaluate", "prune", "inference", "export"})
CPU_ACTIONS = frozenset({"dataset_convert"})


def task_name(action: str) -> str:
    return f"maskops.{action}"


def queue_for(action: str, settings: Settings) -> str:
    return settings.gpu_queue if action in GPU_ACTIONS else settings.cpu_queue


def make_celery(settings: Settings) -> Celery:
    """A Celery app for ``settings``; producers (the API) and consumers share it."""
    app = Celery("maskops", broker=settings.broker_url, include=["maskops_worker.tasks"])
    app.conf.update(
        task_queues=[Queue(settings.gpu_queue), Queue(settings.cpu_queue)],
        task_default_queue=settings.cpu_queue,
        task_routes={
            task_name(a): {"queue": queue_for(a, settings)} for a in GPU_ACTIONS | CPU_ACTIONS
        },
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
        app.conf.broker_transport_options = {"visibility_timeout": 30 * 24 * 3600}
    return app


@worker_process_init.connect
def _allow_loader_processes(**_: Any) -> None:
    """Prefork children are daemonic, and daemonic processes may not start children; the
    training data loader's worker processes need to, and die with the child anyway (the
    worker's process group is killed as one)."""
    multiprocessing.current_process().daemon = False


app = make_celery(get_settings())
