"""A job's log (``<data root>/jobs/<id>/job.log``), which API clients read: every line is
written with the paths under the data root relative to it, whoever writes it.

Three kinds of writers reach it: the worker's own lines (:meth:`JobLog.write`), the engine's
``maskops.train`` logger while a run trains in this process (:meth:`JobLog.engine_lines`),
and the output of child processes such as torchrun and its ranks
(:meth:`JobLog.process_output`). The engine logs the absolute paths it was given (the
checkpoint it resumes from, the torchrun command); clients never learn where the server
keeps its data (errors are made relative the same way, ``maskops_core.paths``).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sysconfig
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from maskops_core.paths import relative_to_root

RELAY_DRAIN_S = 30.0
"""How long the output's last lines are waited for once the child has ended."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
"""The engine's own format for its log file (``maskops.training.train``)."""


@functools.cache
def install_roots() -> tuple[str, ...]:
    """Where this process's code is installed, longest first: site-packages, the standard
    library, and the folders holding maskops' own packages (a source checkout)."""
    import maskops
    import maskops_core
    import maskops_worker

    paths = sysconfig.get_paths()
    roots = {paths[name] for name in ("purelib", "platlib", "stdlib", "platstdlib")}
    roots |= {
        str(Path(p.__file__ or "").parent.parent) for p in (maskops, maskops_core, maskops_worker)
    }
    resolved = {str(Path(root).resolve()) for root in roots} | roots
    return tuple(sorted((r.rstrip("/") for r in resolved if r.strip("/")), key=len, reverse=True))


def relative_to_install(text: str) -> str:
    """``text`` with each path of installed code (a traceback's frames, a warning's source)
    written from its package on: ``/opt/venv/lib/python3.11/site-packages/torch/nn/x.py``
    -> ``torch/nn/x.py``; clients never learn how the server is installed."""
    pattern = "|".join(re.escape(root) + "/" for root in install_roots())
    return re.sub(pattern, "", text)


class JobLog:
    """Appends to ``path``, writing paths under ``data_root`` relative to it."""

    def __init__(self, path: Path, data_root: Path) -> None:
        self.path = path
        self.data_root = data_root
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        """Append ``text`` as whole lines (a newline is added where missing)."""
        text = relative_to_root(text.rstrip("\n"), self.data_root)
        text = relative_to_install(text) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(text)

    @contextmanager
    def engine_lines(self, logger: logging.Logger) -> Iterator[None]:
        """While inside: ``logger``'s records at INFO and above are written here."""
        handler = _JobLogHandler(self)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        previous_level = logger.level
        logger.addHandler(handler)
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(previous_level)

    @contextmanager
    def process_output(self) -> Iterator[IO[bytes]]:
        """A file a child process writes its stdout/stderr to (``Popen(stdout=...)``):
        a pipe whose lines a thread writes here until every writer has closed it."""
        read_fd, write_fd = os.pipe()
        relay = threading.Thread(
            target=self._relay, args=(read_fd,), name="job-log-relay", daemon=True
        )
        relay.start()
        try:
            with os.fdopen(write_fd, "wb") as output:
                yield output
        finally:
            # The child's copies of the write end close when it exits; the relay then
            # reads the end of the file (a descendant that outlives it keeps the pipe
            # open: its later lines are written as they come, nobody waits for them).
            relay.join(timeout=RELAY_DRAIN_S)

    def _relay(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                self.write(raw.decode("utf-8", errors="replace"))


class _JobLogHandler(logging.Handler):
    def __init__(self, log: JobLog) -> None:
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.log.write(self.format(record))
        except Exception:
            self.handleError(record)
