"""Celery tasks: one per action, each taking a job id and wrapping :func:`run_job`.

Queues come from the catalogue through the app's ``task_routes`` (maskops_core.broker).
Reliability: acks_late + reject_on_worker_lost (a message is acknowledged only once its job
ended), soft/hard time limits from the settings, and automatic retries for broker/database
connection errors only; any other failure is recorded on the job by ``run_job``. A pool
process that dies under its job (a segfault, the kernel's OOM killer) cannot record
anything: the worker's main process does (:class:`JobRequest`), and a job that kills its
process twice fails saying what it was doing instead of killing every worker it reaches.

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
import socket
import time
from typing import Any

from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery.exceptions import Reject
from celery.worker import state as worker_state
from celery.worker.request import Request

from maskops_core import job_state
from maskops_core.actions import TRAIN_NODE_TASK, JobAction
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.identity import database_identity
from maskops_core.settings import get_settings
from maskops_worker import streak
from maskops_worker.celery_app import app
from maskops_worker.forks import FORK_GUARD
from maskops_worker.job_log import JobLog
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


class JobRequest(Request):
    """A job's message as the worker's main process handles it; a pool process lost while
    running the job, when the worker is not stopping, is :func:`job_lost_its_process`."""

    def on_failure(
        self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        exc = getattr(exc_info.exception, "exc", exc_info.exception)  # ExceptionWithTraceback
        stopping = worker_state.should_stop or worker_state.should_terminate
        if isinstance(exc, WorkerLostError) and not stopping and self.worker_pid:
            try:
                job_lost_its_process(self.args, self.kwargs, self.worker_pid, str(exc))
            except Exception:  # the message must still go back (the reconciler is the net)
                log.exception("recording a lost worker process failed")
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)


def job_lost_its_process(args: Any, kwargs: Any, pid: int, why: str) -> str | None:
    """Requeue or fail the job of a message whose pool process ``pid`` died (Celery's
    ``WorkerLostError``: "Worker exited prematurely: signal 11 (SIGSEGV) Job: 0."), at
    once rather than after the heartbeat timeout; its message goes back to the broker and
    runs again only while the job is queued. Returns the job's new status (None: that
    process held no attempt of it)."""
    job_id = int(args[0] if args else kwargs["job_id"])
    why = why.removeprefix("Worker exited prematurely: ").split(" Job:")[0].rstrip(".")
    settings = get_settings()
    # A fresh engine, disposed at once: pool processes forked later must not inherit it;
    # the pool forks this process's replacement meanwhile, never mid-transaction (forks).
    engine = make_engine(settings)
    try:
        with FORK_GUARD.held():
            status = job_state.worker_crashed(
                make_session_factory(engine),
                job_id,
                owner_prefix=f"{socket.gethostname()}:{pid}:",
                why=why,
                data_root=settings.data_root,
            )
    finally:
        engine.dispose()
    log.warning("job %s: its worker process %s died (%s); now %s", job_id, pid, why, status)
    if status is not None:
        folder = job_state.job_dir(settings.data_root, job_id)
        JobLog(folder / "job.log", settings.data_root).write(
            f"the worker process {pid} running the job died ({why}); the job is {status}"
        )
    return status


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
        Request=JobRequest,
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
