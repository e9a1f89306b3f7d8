"""Spec errors: the user-facing :class:`SpecError` and the validators' :class:`FieldIssue`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class SpecError(ValueError):
    """A spec that cannot be used, reported as one line.

    ``str(err)`` is ``source:line: field: message`` (``spec.txt:23: maskrcnn_config.nlayers:
    42 is not one of 10, 18, 34, 50, 101``); the line part is absent when unknown (JSON specs,
    or a field left at its default), the field part when the error concerns no single field.
    """

    def __init__(
        self, message: str, *, source: str = "<spec>", line: int | None = None, field: str = ""
    ) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.message = message
        super().__init__(self._render())

    def __reduce__(self) -> tuple[Any, tuple[str, str, int | None, str]]:
        # Keyword-only state would be lost by default exception pickling (Celery results).
        return (_rebuild, (self.message, self.source, self.line, self.field))

    def _render(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


def _rebuild(message: str, source: str, line: int | None, field: str) -> SpecError:
    return SpecError(message, source=source, line=line, field=field)


class FieldIssue(ValueError):
    """Raised by cross-field validators to blame a specific field.

    ``field`` is a dotted path relative to the model whose validator raises it. ``related``
    are other fields (same base) whose line may be shown when ``field`` itself is not written
    in the spec text (it has its default value).
    """

    def __init__(self, field: str, message: str, *, related: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.related = tuple(related)
