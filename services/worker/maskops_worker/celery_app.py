"""The worker's Celery application: the control plane's app with the task module loaded."""

from __future__ import annotations

import multiprocessing
from typing import Any

from celery.signals import worker_process_init

from maskops_core import automl as searches
from maskops_core.broker import make_celery
from maskops_core.settings import get_settings
from maskops_worker import (
    forks,
    liveness,  # noqa: F401  (connects the heartbeat signals)
)


@worker_process_init.connect
def _after_fork(**_: Any) -> None:
    """Prefork children are daemonic, and daemonic processes may not start children; the
    training data loader's worker processes need to, and die with the child anyway (the
    worker's process group is killed as one). The child leaves its parent's database
    connections alone and exits if it cannot write its databases (:mod:`forks`)."""
    multiprocessing.current_process().daemon = False
    forks.drop_inherited(searches.storage_engines())
    forks.check_writable_or_exit(get_settings())


app = make_celery(get_settings(), include=["maskops_worker.tasks"])
