"""The worker's heartbeat row (see :mod:`maskops_core.workers`), written by a thread of the
Celery main process from ``worker_ready`` until ``worker_shutdown``.

The main process beats, not the pool child: a long job keeps the child busy, and a dead
main process is exactly what ``/readyz`` must notice.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from sqlalchemy.exc import SQLAlchemyError

from maskops_core import workers
from maskops_core.db.models import utcnow
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import get_settings

log = logging.getLogger(__name__)


NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
"""One folder per NVIDIA GPU of the host (Linux driver)."""


def visible_gpus() -> int:
    """The NVIDIA GPUs this process may use, without initialising CUDA (this is the Celery
    main process: CUDA initialised before the pool forks is unusable in the children)."""
    try:
        count = sum(1 for _ in NVIDIA_GPUS.iterdir())
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count
    listed = [d for d in visible.split(",") if d.strip()]
    if listed and listed[0].strip() == "-1":
        return 0
    return min(count, len(listed))


class _Beater(threading.Thread):
    def __init__(self, hostname: str, queues: list[str]) -> None:
        super().__init__(name="worker-heartbeat", daemon=True)
        self.hostname = hostname
        self.queues = queues
        self.done = threading.Event()
        self.settings = get_settings()
        self.engine = make_engine(self.settings)
        self.factory = make_session_factory(self.engine)
        self.started_at = utcnow()
        self.gpus = (
            visible_gpus() if self.settings.worker_gpus is None else self.settings.worker_gpus
        )

    def run(self) -> None:
        while True:
            try:
                workers.beat(
                    self.factory,
                    self.hostname,
                    queues=self.queues,
                    pid=os.getpid(),
                    started_at=self.started_at,
                    retention_s=self.settings.worker_row_retention_s,
                    gpus=self.gpus,
                )
            except SQLAlchemyError as exc:
                log.warning("worker heartbeat failed: %s", exc)
            # No connection stays open between beats: pool children forked meanwhile must
            # not inherit (and on exit close) a connection this thread uses.
            self.engine.dispose()
            if self.done.wait(self.settings.heartbeat_interval_s):
                return

    def stop(self) -> None:
        self.done.set()
        self.join(10)
        try:
            workers.forget(self.factory, self.hostname)
        except SQLAlchemyError as exc:
            log.warning("could not remove the worker heartbeat row: %s", exc)
        self.engine.dispose()


_beater: _Beater | None = None


@worker_ready.connect
def _start(sender: Any = None, **_: Any) -> None:
    global _beater
    queues = sorted(sender.app.amqp.queues.consume_from)
    _beater = _Beater(sender.hostname, queues)
    _beater.start()


@worker_shutdown.connect
def _stop(**_: Any) -> None:
    if _beater is not None:
        _beater.stop()
