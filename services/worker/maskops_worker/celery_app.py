"""The worker's Celery application: the control plane's app with the task module loaded."""

from __future__ import annotations

import multiprocessing
from typing import Any

from celery.signals import worker_process_init

from maskops_core.broker import make_celery
from maskops_core.settings import get_settings
from maskops_worker import liveness  # noqa: F401  (connects the heartbeat signals)


@worker_process_init.connect
def _allow_loader_processes(**_: Any) -> None:
    """Prefork children are daemonic, and daemonic processes may not start children; the
    training data loader's worker processes need to, and die with the child anyway (the
    worker's process group is killed as one)."""
    multiprocessing.current_process().daemon = False


app = make_celery(get_settings(), include=["maskops_worker.tasks"])
