"""``POST /infer`` answers what it can from the request itself, before any Triton: the
format from the magic bytes (415), the size from the header (413), the model from the
published models (404). Real app on Postgres; no Triton is configured here, so a request
that passes every check ends in the 503 that says so."""

from __future__ import annotations

import gc
import io
import struct
import time
import zlib

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from maskops_core.db.models import Job, PublishedModel
from tests.conftest import PeakRss

pytestmark = pytest.mark.integration


def _image(fmt: str, size: tuple[int, int] = (32, 24)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(buffer, fmt)
    return buffer.getvalue()


def _huge_png(width: int, height: int) -> bytes:
    """A PNG header announcing ``width x height`` (the pixel data never comes)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", zlib.crc32(chunk[4:]))


def _icc_jpeg() -> bytes:
    """A valid JPEG whose frame header follows 100 KiB of ICC profile (two APP2 segments,
    as cameras and editors write large profiles)."""
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (10, 200, 10)).save(buffer, "JPEG", icc_profile=b"\0" * 100_000)
    data = buffer.getvalue()
    assert data.index(b"\xff\xc0") > 64 * 1024
    return data


def _infer(client: TestClient, data: bytes, model: str = "shapes") -> tuple[int, str]:
    response = client.post("/infer", params={"model": model}, files=[("images", ("x.img", data))])
    return response.status_code, response.json()["detail"]


@pytest.fixture
def published(client: TestClient) -> str:
    factory = client.app.state.session_factory  # type: ignore[attr-defined]
    with factory() as session:
        job = Job(action="export", status="succeeded", queue="gpu")
        session.add(job)
        session.flush()
        session.add(PublishedModel(name="shapes", version=1, job_id=job.id))
        session.commit()
    return "shapes"


@pytest.mark.parametrize(
    ("data", "status", "says"),
    [
        (_image("GIF"), 415, "GIF images are not supported"),
        (_image("BMP"), 415, "BMP images are not supported"),
        (b"hello, not an image at all", 415, "not a JPEG or PNG"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF" + b"\x00" * 40, 422, "corrupt JPEG"),
        (_huge_png(100_000, 100_000), 413, "100000 x 100000 pixels is above the limit"),
        (_huge_png(50_000_000, 1), 422, "an aspect ratio above the limit of 20:1"),
        (_huge_png(1, 40_000), 422, "an aspect ratio above the limit of 20:1"),
        (_huge_png(30_000, 1_600), 413, "a side above the limit of 20000 pixels"),
        (_icc_jpeg(), 503, "no Triton is configured"),  # past the door: only Triton missing
    ],
)
def test_images_are_checked_at_the_door(
    client: TestClient, published: str, data: bytes, status: int, says: str
) -> None:
    # Judged from the header, quickly. In CPU seconds, not wall time: the other test
    # process may hold the cores meanwhile (a wall-clock bound of 1 s once failed at 1.03 s).
    # Without the garbage collector: a full collection of what this long-lived test process
    # holds from earlier tests once took 1.1 s of the process's CPU inside the call.
    gc.collect()
    gc.disable()
    try:
        started = time.process_time()
        with PeakRss() as api_process:  # in-process: the API is this process
            code, detail = _infer(client, data, published)
        seconds = time.process_time() - started
    finally:
        gc.enable()
    assert (code, says in detail) == (status, True), detail
    assert " object at 0x" not in detail
    assert seconds < 1.0
    # Judged from the header: nothing the size of the image (30 GB for the PNG) is allocated.
    assert api_process.grew_mb < 16, api_process.grew_mb


def test_only_published_models_are_called(client: TestClient, published: str) -> None:
    for internal in ("shapes_net", "shapes_preprocess", "nothing"):
        code, detail = _infer(client, _image("PNG"), internal)
        assert code == 404 and f"model {internal!r} is not published" in detail
    response = client.post(
        "/infer",
        params={"model": published, "version": "7"},
        files=[("images", ("x.jpg", _image("JPEG")))],
    )
    assert response.status_code == 404 and "version 7" in response.json()["detail"]
    # Everything checked: only the missing Triton is left to say.
    code, detail = _infer(client, _image("JPEG"), published)
    assert code == 503 and "no Triton is configured" in detail


@pytest.mark.parametrize(
    ("content_type", "body", "status", "says"),
    [
        # Starlette's form parser answered these 400, a code the OpenAPI document does not
        # list for /infer (the dataset upload answers a malformed body 422).
        ("multipart/form-data", b"", 422, "malformed multipart body: Missing boundary"),
        ("multipart/form-data; boundary=xyz", b"garbage", 422, "malformed multipart body"),
    ],
)
def test_an_unparsable_form_is_documented_422(
    client: TestClient, published: str, content_type: str, body: bytes, status: int, says: str
) -> None:
    response = client.post(
        "/infer", params={"model": published}, content=body, headers={"Content-Type": content_type}
    )
    assert (response.status_code, response.json()["detail"].startswith(says)) == (status, True), (
        response.text
    )


def test_a_form_beyond_the_parsers_limits_is_413(client: TestClient, published: str) -> None:
    png = _image("PNG")
    # More files than the form parser takes (1000): a 413 as for more than
    # MASKOPS_MAX_INFER_IMAGES, not a 400.
    response = client.post(
        "/infer", params={"model": published}, files=[("images", ("x.png", png))] * 1001
    )
    assert response.status_code == 413, response.text
    assert "Too many files" in response.json()["detail"]
    # A text field above the parser's 1 MiB per part.
    response = client.post(
        "/infer",
        params={"model": published},
        data={"note": "x" * (1024 * 1024 + 1)},
        files=[("images", ("x.png", png))],
    )
    assert response.status_code == 413, response.text
    assert "exceeded maximum size" in response.json()["detail"]


def test_images_sent_as_text_are_named(client: TestClient, published: str) -> None:
    """curl -F images=x.jpg (without the @) sends the file's name as text."""
    response = client.post(
        "/infer", params={"model": published}, files=[("images", (None, "x.jpg"))]
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == "images.0: a file is expected, not text"
