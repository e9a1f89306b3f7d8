"""Progress of a long command (conversion, evaluation, export): a one-line tqdm bar with
count, rate and ETA when stderr is a terminal, plain lines when it is a file or a pipe.

A bar redraws one line with carriage returns, which a log file or ``| tee`` keeps as one
unreadable line; there :class:`PlainProgress` writes a whole line every
``min_interval_s`` seconds instead, and always one at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
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
        print(self.line(), file=self.stream or sys.stderr, flush=True)
        self._last = self.clock()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._last is None or self.clock() - self._last >= self.min_interval_s:
            self._write()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
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
    if enabled or sys.stderr.isatty():
        from tqdm import tqdm

        bar: Progress = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=True)
        return bar
    return PlainProgress(total, desc=desc, unit=unit)
