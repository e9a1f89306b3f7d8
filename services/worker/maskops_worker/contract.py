"""The contract between the runner and the actions: what an action gets
(:class:`JobContext`), its signature (:data:`Action`) and the errors it may raise.

The runner, the actions and the training hook all import this module and not each other.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from maskops.path_rules import PathEscape, confine
from maskops_core import job_state
from maskops_core.settings import Settings
from maskops_worker.job_log import JobLog

log = logging.getLogger(__name__)


class JobCancelled(Exception):
    """Raised by an action that stopped for a cancel request; ``result`` is what it kept."""

    def __init__(self, result: dict[str, Any] | None = None) -> None:
        super().__init__("cancelled")
        self.result = result or {}


class JobRequeued(Exception):
    """Raised by an action that could not start for now (the nodes of a multi-node job did
    not gather): the job goes back to the queue with this reason."""


class JobInputError(Exception):
    """The job cannot run with what it was given; the message is shown to the user."""


@dataclass
class JobContext:
    """What an action gets: its job, a working directory, and ways to report back."""

    job: job_state.JobSnapshot
    settings: Settings
    work_dir: Path
    log_file: Path
    factory: sessionmaker[Session]
    owner: str
    stop_event: threading.Event = field(default_factory=threading.Event)
    """Set when the job should stop at the next step (cancel requested, or lease lost)."""
    lease_lost: threading.Event = field(default_factory=threading.Event)

    @cached_property
    def job_log(self) -> JobLog:
        """The job's log (``log_file``), which writes paths relative to the data root."""
        return JobLog(self.log_file, self.settings.data_root)

    @property
    def cancel_requested(self) -> bool:
        return self.stop_event.is_set()

    def report(
        self, step: int, total: int | None = None, metrics: dict[str, float] | None = None
    ) -> None:
        """Record progress; never raises for a database hiccup (the heartbeat carries on)."""
        try:
            kept = job_state.report_progress(
                self.factory,
                self.job.id,
                owner=self.owner,
                step=step,
                total=total,
                metrics=metrics,
            )
        except SQLAlchemyError as exc:
            log.warning("job %s: progress report failed: %s", self.job.id, exc)
            return
        if not kept:
            self.lease_lost.set()
            self.stop_event.set()

    def data_path(self, relative: str) -> Path:
        return self.settings.data_root / relative

    def input_path(self, relative: str, what: str) -> Path:
        """``relative`` under the data root, which must exist here.

        A missing input is usually a data root that is not shared: the file was written by
        the API or a worker on another host. The error says so, naming the path as stored.
        """
        if relative:
            try:
                confine(self.settings.data_root, relative)
            except PathEscape:
                message = "must be a path relative to the data root without '..' or links out of it"
                raise JobInputError(f"{what} {relative!r} {message}") from None
            except (OSError, RuntimeError) as exc:  # a link loop
                raise JobInputError(f"{what} {relative!r}: {type(exc).__name__}") from None
        path = self.data_path(relative)
        if not relative or not path.exists():
            raise JobInputError(
                f"{what} {relative!r} is not in the data root on worker {socket.gethostname()}:"
                " it was written on another host, or deleted. The API and every worker must"
                " mount the same data root (MASKOPS_DATA_ROOT) on shared storage."
            )
        return path


Action = Callable[[JobContext], dict[str, Any]]
