"""A ``multipart/form-data`` body parsed as it arrives, its one file part written straight to
the file the route gives.

Starlette's form parser spools every file part to a temporary file first (in memory up to
1 MB, then in the system's temporary folder), which a route writing the upload somewhere
else then copies again: every byte of a 2 GB dataset archive written twice, the first time
outside the data root. Here the file part's bytes go once to ``out``, counted against
``max_file_bytes`` as they arrive; the other parts are small text fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from fastapi.concurrency import run_in_threadpool
from python_multipart import MultipartParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect, Request

from maskops_api.errors import Invalid, TooLarge

MAX_FIELD_BYTES = 64 * 1024
"""The largest text field (the body's total is limited by ``body_limit``)."""
MAX_PARTS = 64


@dataclass
class StreamedForm:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    """The file part's file name; ``None`` when the body had no such part."""
    file_bytes: int = 0


class _Collector:
    """python-multipart's callbacks: a part's headers, then its bytes to a field or the file."""

    def __init__(self, form: StreamedForm, file_field: str, max_file_bytes: int) -> None:
        self.form, self.file_field, self.max_file_bytes = form, file_field, max_file_bytes
        self.header_name = self.header_value = self.disposition = b""
        self.name = ""
        self.to_file = False
        self.text = bytearray()
        self.parts = 0
        self.pending: list[bytes] = []
        """File bytes parsed from the last chunk, not written yet (written off the loop)."""

    def callbacks(self) -> dict[str, Callable[..., None]]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
        }

    def on_part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise Invalid(f"the form has more than {MAX_PARTS} parts")
        self.disposition, self.to_file = b"", False
        self.text.clear()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        if self.header_name.lower() == b"content-disposition":
            self.disposition = self.header_value
        self.header_name = self.header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.disposition)
        # A part without a name is one more field the route does not know: ignored.
        self.name = _text(options.get(b"name", b""), "a form part's name")
        if b"filename" not in options:
            return
        if self.name != self.file_field:
            # Read as a text field, a file sent under another name (curl -F file=@d.zip)
            # was refused as "not UTF-8" or as a field above 64 KiB.
            part = f"form part {self.name!r}" if self.name else "a form part without a name"
            raise Invalid(
                f"{part} is a file: send it as the {self.file_field!r} part (the other "
                "fields are text)"
            )
        if self.form.filename is not None:
            raise Invalid(f"{self.file_field}: one file only")
        self.form.filename = _text(options[b"filename"], f"{self.file_field}'s file name")
        self.to_file = True

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self.to_file:
            self.form.file_bytes += len(chunk)
            if self.form.file_bytes > self.max_file_bytes:
                raise TooLarge(f"upload larger than {self.max_file_bytes} bytes")
            self.pending.append(chunk)
            return
        if len(self.text) + len(chunk) > MAX_FIELD_BYTES:
            raise TooLarge(f"form field {self.name!r} is larger than {MAX_FIELD_BYTES} bytes")
        self.text += chunk

    def on_part_end(self) -> None:
        if not self.to_file and self.name:
            self.form.fields[self.name] = _text(bytes(self.text), f"form field {self.name!r}")


def _text(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid(f"{what} is not UTF-8") from None


async def read_form(
    request: Request, out: IO[bytes], *, file_field: str, max_file_bytes: int
) -> StreamedForm:
    """Parse the request's multipart body; the part ``file_field`` is written to ``out``.

    Raises:
        Invalid: not a multipart body, a malformed one, or the client went away.
        TooLarge: the file is above ``max_file_bytes``, or a text field above 64 KiB.
    """
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise Invalid("the body must be multipart/form-data")
    form = StreamedForm()
    collector = _Collector(form, file_field, max_file_bytes)
    parser: Any = MultipartParser(boundary, collector.callbacks())  # type: ignore[arg-type]
    try:
        async for chunk in request.stream():
            parser.write(chunk)
            if collector.pending:
                data = b"".join(collector.pending)
                collector.pending.clear()
                await run_in_threadpool(out.write, data)
        parser.finalize()
    except FormParserError as exc:
        raise Invalid(f"malformed multipart body: {exc}") from None
    except ClientDisconnect:
        # Also what body_limit's refusal looks like from here; its 413 has been sent.
        raise Invalid("the client went away before the body was complete") from None
    return form
