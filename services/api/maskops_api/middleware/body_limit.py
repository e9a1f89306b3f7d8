"""Request bodies refused as they arrive, with a limit per route (pure ASGI middleware).

A body is refused with 413 before the app reads any of it when its ``Content-Length``
is above the route's limit, and as soon as the bytes received pass the limit otherwise
(chunked bodies, or a Content-Length that lies): neither the whole body nor a spool
file of it is ever held. The route then sees a disconnected client and its answer is
dropped; once it has returned (having removed what it stored of the body), the client gets
the 413 (and the connection is closed, the rest unread).

Limits: ``POST /datasets/upload`` takes archives (``max_upload_bytes``), ``POST /infer``
images (``max_infer_images`` x ``max_infer_image_bytes``), every other route JSON
(``max_json_body_bytes``). Multipart bodies get ``MULTIPART_SLACK`` on top for their
form fields and part headers.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from maskops_core.settings import Settings

MULTIPART_SLACK = 64 * 1024


def body_limit(settings: Settings, path: str) -> int:
    """The largest request body that ``path`` accepts."""
    if path == "/datasets/upload":
        return settings.max_upload_bytes + MULTIPART_SLACK
    if path == "/infer":
        return settings.max_infer_images * (settings.max_infer_image_bytes + MULTIPART_SLACK)
    return settings.max_json_body_bytes


class BodyLimit:
    def __init__(self, app: ASGIApp, *, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(self.settings, scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, limit)
            return
        received = 0
        refused = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out; the route's answer to a "disconnect" is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        finally:
            # The 413 goes out once the route has returned: what it stored of the refused
            # body (a partial upload) is gone by the time the client hears the answer.
            if refused and not started:
                await _refuse(send, limit)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps({"detail": f"request body larger than {limit} bytes"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
