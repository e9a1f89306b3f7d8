"""The worker's heartbeat row (see :mod:`maskops_core.workers`), written by a thread of the
Celery main process from ``worker_ready`` until ``worker_shutdown``.

The main process beats, not the pool child: a long job keeps the child busy, and a dead
main process is exactly what ``/readyz`` must notice.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from sqlalchemy.exc import SQLAlchemyError

from maskops import device
from maskops_core import workers
from maskops_core.db.models import utcnow
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings, get_settings
from maskops_core.workers import CUDA_UNUSABLE
from maskops_worker import streak
from maskops_worker.forks import FORK_GUARD

log = logging.getLogger(__name__)


def check_cuda_at_start(queues: list[str], gpu_queue: str) -> str:
    """The heartbeat's ``cuda`` field: a worker of the gpu queue checks CUDA in a fresh
    interpreter (this is the Celery main process: CUDA initialised before the pool forks is
    unusable in the children); other workers run no GPU work and say so."""
    if gpu_queue not in queues:
        return "not checked: this worker takes no gpu-queue jobs"
    try:
        summary = device.check_cuda(device.cuda_report_subprocess()).summary()
    except device.DeviceError as exc:
        summary = f"unusable: {exc}"
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        summary = f"failed: the CUDA check did not run ({type(exc).__name__}: {exc})"
    (log.error if summary.startswith(CUDA_UNUSABLE) else log.info)("CUDA check: %s", summary)
    return summary


class _Beater(threading.Thread):
    def __init__(self, hostname: str, queues: list[str], settings: Settings | None = None) -> None:
        super().__init__(name="worker-heartbeat", daemon=True)
        self.hostname = hostname
        self.queues = queues
        self.done = threading.Event()
        self.settings = settings or get_settings()
        self.engine = make_engine(self.settings)
        self.factory = make_session_factory(self.engine)
        self.started_at = utcnow()
        self.gpus = (
            device.gpus_present()
            if self.settings.worker_gpus is None
            else self.settings.worker_gpus
        )
        self.cuda = ""

    def run(self) -> None:
        # The first beat goes out at once (readiness); the CUDA check follows it.
        self._beat()
        self.cuda = check_cuda_at_start(self.queues, self.settings.gpu_queue)
        while True:
            self._beat()
            if self.done.wait(self.settings.heartbeat_interval_s):
                return

    def _beat(self) -> None:
        # Under the fork guard: a pool process forked mid-transaction would inherit
        # SQLite's write lock, held for ever (maskops_worker.forks).
        with FORK_GUARD.held():
            try:
                workers.beat(
                    self.factory,
                    self.hostname,
                    queues=self.queues,
                    pid=os.getpid(),
                    started_at=self.started_at,
                    retention_s=self.settings.worker_row_retention_s,
                    gpus=self.gpus,
                    cuda=self.cuda,
                    failing=streak.failing(),
                )
            except SQLAlchemyError as exc:
                log.warning("worker heartbeat failed: %s", exc)
            # No connection stays open between beats: pool children forked meanwhile
            # must not inherit (and on exit close) a connection this thread uses.
            self.engine.dispose()

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
