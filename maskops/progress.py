"""Progress of a long command (conversion, evaluation, inference, export, engine build): a
one-line tqdm bar with count, rate and ETA when stderr is a terminal, plain lines when it
is a file or a pipe.

A bar redraws one line with carriage returns, which a log file or ``| tee`` keeps as one
unreadable line; there :class:`PlainProgress` writes a whole line every
``min_interval_s`` seconds instead, and always one at the end.

A command of several stages (export: trace, calibrate, check, write, build) announces each
with :func:`stage`: a plain line through the command's log, and a bar for a stage that has
a count. Builders that report phases of steps (TensorRT's) go through
:class:`PhaseProgress`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import Protocol, TextIO

PLAIN_INTERVAL_S = 10.0
"""Seconds between plain progress lines (the first and the last are always written)."""


class Progress(Protocol):
    """What a command advances: ``update(n)`` after n more units, ``close()`` at the end."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


def format_duration(seconds: float) -> str:
    """``1:02:03`` / ``2:03`` / ``5s``: tqdm's style, without the fraction."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}" if minutes else f"{secs}s"


class PlainProgress:
    """Whole lines such as ``evaluate: 4/8 img (50%), 3.1 img/s, ETA 1s``."""

    def __init__(
        self,
        total: int | None,
        *,
        desc: str,
        unit: str,
        stream: TextIO | None = None,
        min_interval_s: float = PLAIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.done = 0
        self._started = clock()
        self._last: float | None = None
        self._last_done = -1
        self._closed = False

    def line(self) -> str:
        elapsed = self.clock() - self._started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        count = f"{self.done}/{self.total}" if self.total else str(self.done)
        text = f"{self.desc}: {count} {self.unit}"
        if self.total:
            text += f" ({100 * self.done // self.total}%)"
        text += f", {rate:.2f} {self.unit}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", ETA {format_duration((self.total - self.done) / rate)}"
        else:
            text += f", {format_duration(elapsed)} elapsed"
        return text

    def _write(self) -> None:
        _flush_stdout()
        print(self.line(), file=self.stream or sys.stderr, flush=True)
        self._last, self._last_done = self.clock(), self.done

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._last is None or self.clock() - self._last >= self.min_interval_s:
            self._write()

    def close(self) -> None:
        """The last line, unless the last update already wrote this count."""
        if not self._closed:
            self._closed = True
            if self.done != self._last_done:
                self._write()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _draws_a_bar(enabled: bool | None) -> bool:
    """Whether :func:`progress_bar` draws a tqdm bar for this ``enabled``."""
    return enabled is not False and (enabled is True or sys.stderr.isatty())


def _flush_stdout() -> None:
    """Log lines go to stdout and progress to stderr: in ``2>&1 | tee`` stdout is
    block-buffered, so without this a stage's line would come out after its progress."""
    sys.stdout.flush()


class _NoProgress:
    def update(self, n: int = 1) -> None:
        return None

    def close(self) -> None:
        return None


def progress_bar(
    total: int | None, *, desc: str, unit: str, enabled: bool | None = None
) -> Progress:
    """A bar on a terminal, plain lines elsewhere (``enabled=None``, the default); ``True``
    forces the bar, ``False`` shows nothing. Close it (or use ``contextlib.closing``)."""
    if enabled is False:
        return _NoProgress()
    _flush_stdout()
    if _draws_a_bar(enabled):
        from tqdm import tqdm

        bar: Progress = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=True)
        return bar
    return PlainProgress(total, desc=desc, unit=unit)


def shown(progress: bool) -> bool | None:
    """``progress_bar``'s ``enabled`` for a command's ``progress`` switch: on, a bar or
    plain lines as stderr allows; off, nothing."""
    return None if progress else False


@contextmanager
def stage(
    log: Callable[[str], None],
    line: str,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "",
    enabled: bool | None = None,
) -> Iterator[Progress]:
    """One stage of a long command: ``line`` through ``log`` (always, a whole line), then,
    for a stage with a count (``total``), a bar named ``desc`` counting ``unit`` that the
    body advances; closed when the stage ends. Without a count the body gets a progress
    that shows nothing. ``enabled`` as for :func:`progress_bar`."""
    log(line)
    if not total:
        yield _NoProgress()
        return
    with _log_records_above_the_bar(enabled):
        bar = progress_bar(total, desc=desc, unit=unit, enabled=enabled)
        try:
            yield bar
        finally:
            bar.close()


def _log_records_above_the_bar(enabled: bool | None) -> AbstractContextManager[object]:
    """While a bar is drawn, log records (a library's warnings) go through tqdm, which
    writes each above the bar and redraws it, instead of into the bar's line."""
    if not _draws_a_bar(enabled):
        return nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()


class PhaseProgress:
    """A bar per top-level phase of a builder that reports phases of steps, as TensorRT's
    ``IProgressMonitor`` does: ``phase_start(name, parent, num_steps)``,
    ``step_complete(name, step)`` (True: go on), ``phase_finish(name)``.

    Nested phases (a parent named) advance nothing: their step counts are of another
    scale, and one line per top-level phase keeps the screen readable. The builder calls
    from several threads, hence the lock.
    """

    def __init__(self, *, desc: str, enabled: bool | None = None) -> None:
        self.desc, self.enabled = desc, enabled
        self._bars: dict[str, Progress] = {}
        self._lock = threading.Lock()

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        if parent_phase is not None:
            return
        with self._lock:
            desc = f"{self.desc}: {phase_name}"
            self._bars[phase_name] = progress_bar(
                num_steps, desc=desc, unit="step", enabled=self.enabled
            )

    def step_complete(self, phase_name: str, step: int) -> bool:
        with self._lock:
            if (bar := self._bars.get(phase_name)) is not None:
                bar.update(1)
        return True

    def phase_finish(self, phase_name: str) -> None:
        with self._lock:
            if (bar := self._bars.pop(phase_name, None)) is not None:
                bar.close()

    def close(self) -> None:
        """Close the bars of phases left unfinished (a failed build)."""
        with self._lock:
            for bar in self._bars.values():
                bar.close()
            self._bars.clear()
