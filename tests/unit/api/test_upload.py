"""Dataset upload: a zip/tar is extracted under the data root and registered; traversal,
links, bombs, oversized and non-archive uploads are 4xx and leave nothing behind."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from maskops_api.main import create_app
from maskops_api.services.uploads import MAX_RATIO, TooLargeArchive, extract_archive
from maskops_core.settings import Settings
from tests.conftest import PeakRss
from tests.unit.api.conftest import ARCHIVE_LAYOUT, RecordingDispatcher, tar_bytes, zip_bytes


@pytest.fixture
def small_client(settings: Settings) -> Iterator[TestClient]:
    limited = settings.model_copy(
        update={"max_upload_bytes": 200_000, "max_extracted_bytes": 500_000}
    )
    with TestClient(
        base_url="http://localhost", app=create_app(limited, dispatcher=RecordingDispatcher())
    ) as client:
        yield client


def _upload(client: TestClient, data: bytes, name: str = "d.zip") -> tuple[int, dict]:
    response = client.post("/datasets/upload", data={"name": "up"}, files={"archive": (name, data)})
    return response.status_code, response.json()


@pytest.mark.parametrize("pack", [zip_bytes, tar_bytes])
def test_upload_registers_the_extracted_dataset(
    small_client: TestClient, settings: Settings, pack
) -> None:
    code, body = _upload(small_client, pack(ARCHIVE_LAYOUT))
    assert code == 201, body
    assert set(body["splits"]) == {"train", "val"} and body["status"] == "queued"
    folder = settings.data_root / body["splits"]["train"]["image_dir"]
    assert (folder / "1.jpg").read_bytes() == b"x"
    assert folder.resolve().is_relative_to((settings.data_root / "uploads").resolve())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (zip_bytes({**ARCHIVE_LAYOUT, "../evil.txt": b"!"}), "leaves the archive"),
        (zip_bytes({**ARCHIVE_LAYOUT, "/abs.txt": b"!"}), "leaves the archive"),
        (zip_bytes(ARCHIVE_LAYOUT, symlink="images/train/link"), "links are not allowed"),
        (tar_bytes(ARCHIVE_LAYOUT, symlink="images/link"), "only files and folders"),
        (b"definitely not an archive", "not a zip or tar"),
        (tar_bytes({**ARCHIVE_LAYOUT, "r.bin": bytes(range(256)) * 40})[:-300], "corrupt archive"),
    ],
)
def test_unsafe_or_bad_archives_are_422_and_cleaned_up(
    small_client: TestClient, settings: Settings, data: bytes, message: str
) -> None:
    code, body = _upload(small_client, data)
    assert code == 422 and message in body["detail"], body
    leftovers = list((settings.data_root / "uploads").iterdir())
    assert leftovers == []
    assert not (settings.data_root / "evil.txt").exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (zip_bytes({**ARCHIVE_LAYOUT, "bomb.bin": b"\0" * 400_000}), "compression ratio"),
        (tar_bytes({**ARCHIVE_LAYOUT, "big.bin": bytes(range(256)) * 2400}), "size limit"),
    ],
)
def test_archives_expanding_too_far_are_413_and_cleaned_up(
    small_client: TestClient, settings: Settings, data: bytes, message: str
) -> None:
    code, body = _upload(small_client, data)
    assert code == 413 and message in body["detail"], body
    assert list((settings.data_root / "uploads").iterdir()) == []


@pytest.fixture
def roomy_client(settings: Settings) -> Iterator[TestClient]:
    """Room for 64 MiB extracted: only the compression ratio can stop a small bomb."""
    limited = settings.model_copy(
        update={"max_upload_bytes": 200_000, "max_extracted_bytes": 64 * 1024**2}
    )
    with TestClient(
        base_url="http://localhost", app=create_app(limited, dispatcher=RecordingDispatcher())
    ) as client:
        yield client


ZEROS = b"\0" * (8 * 1024**2)
BOMB_ZEROS = b"\0" * (32 * 1024**2)


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz"])
def test_compressed_tar_bombs_stop_at_the_ratio_and_leave_nothing(
    roomy_client: TestClient, settings: Settings, compression: str
) -> None:
    bomb = tar_bytes({**ARCHIVE_LAYOUT, "zeros.bin": BOMB_ZEROS}, compression=compression)
    assert len(bomb) * MAX_RATIO < len(BOMB_ZEROS) // 2  # a bomb by the ratio, not by the size
    with PeakRss() as api_process:  # in-process: the API is this process
        code, body = _upload(roomy_client, bomb, name=f"d.tar.{compression}")
    assert code == 413 and "compression ratio above 200:1" in body["detail"], body
    assert list((settings.data_root / "uploads").iterdir()) == []
    # Extracted in 1 MiB chunks: half of what a member read whole would need (measured:
    # 3-6 MB).
    assert api_process.grew_mb < len(BOMB_ZEROS) / 2 / 1024**2, api_process.grew_mb


def test_extraction_stops_writing_at_the_budget(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.tar.bz2"
    archive.write_bytes(tar_bytes({"a.bin": ZEROS, "b.bin": ZEROS}, compression="bz2"))
    dest = tmp_path / "out"
    # Stopped inside the first member (not after writing both), and nothing is left.
    with pytest.raises(TooLargeArchive, match=r"'a\.bin'.*size limit of 3145728"):
        extract_archive(archive, dest, max_bytes=3 * 1024**2, max_ratio=10**9)
    assert not dest.exists()


def test_oversized_upload_is_413(small_client: TestClient) -> None:
    code, body = _upload(small_client, b"z" * 300_000)
    assert code == 413 and "larger than" in body["detail"]


def test_oversized_json_body_is_413_before_parsing(client: TestClient) -> None:
    big = b'{"name": "' + b"x" * (1024**2 + 10) + b'"}'
    response = client.post(
        "/experiments", content=big, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert "larger than 1048576 bytes" in response.json()["detail"]


def test_chunked_body_over_the_limit_is_413(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"name": "'
        for _ in range(20):
            yield b"x" * 100_000
        yield b'"}'

    response = client.post(
        "/experiments", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413, response.text


def test_the_archive_is_written_once_under_the_data_root_as_it_arrives(
    small_client: TestClient, settings: Settings
) -> None:
    """Not spooled first (Starlette's form parser would, and the route copied that): the
    bytes reach their file under ``uploads/`` while the rest of the body is still coming."""
    archive = zip_bytes({**ARCHIVE_LAYOUT, "noise.bin": os.urandom(150_000)})
    request = httpx.Request("POST", "/", data={"name": "up"}, files={"archive": ("d.zip", archive)})
    body = request.read()
    written: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 16 * 1024):
            yield body[start : start + 16 * 1024]
            # Resumed when the app asks for the next chunk: what it wrote of this one is there.
            written.append(sum(p.stat().st_size for p in settings.data_root.glob("uploads/*.part")))

    async def upload() -> httpx.Response:
        transport = httpx.ASGITransport(app=small_client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            headers = {"Content-Type": request.headers["Content-Type"]}
            return await client.post("/datasets/upload", content=chunks(), headers=headers)

    response = asyncio.run(upload())
    assert response.status_code == 201, response.text
    assert written[0] > 0 and written == sorted(written), written
    assert written[-2] > len(archive) // 2  # before the last chunk arrived
    assert list(settings.data_root.glob("uploads/*.part")) == []


def test_missing_train_files_in_archive_is_404(small_client: TestClient) -> None:
    code, body = _upload(small_client, zip_bytes({"other/x.jpg": b"x"}))
    assert code == 404 and "train.image_dir" in body["detail"]


def _deep_tar(levels: int, *, dirs_only: bool) -> bytes:
    """A tar of ``levels`` nested folders (each its own member, as ``tar c`` writes a tree),
    with a file at the bottom unless ``dirs_only``."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in ARCHIVE_LAYOUT.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for depth in range(1, levels + 1):
            folder = tarfile.TarInfo("/".join(["d"] * depth))
            folder.type = tarfile.DIRTYPE
            archive.addfile(folder)
        if not dirs_only:
            leaf = tarfile.TarInfo("/".join(["d"] * levels) + "/f.txt")
            leaf.size = 1
            archive.addfile(leaf, io.BytesIO(b"!"))
    return buffer.getvalue()


@pytest.mark.parametrize(
    "data",
    [
        zip_bytes({**ARCHIVE_LAYOUT, "a/" * 1100 + "f.txt": b"!"}),
        _deep_tar(1500, dirs_only=True),
        _deep_tar(1100, dirs_only=False),
        zip_bytes({**ARCHIVE_LAYOUT, "n" * 1100 + "/f.txt": b"!"}),
    ],
    ids=["zip-1100-deep", "tar-1500-levels", "tar-1100-deep-file", "long-name"],
)
def test_deep_or_long_member_paths_are_422_at_the_door(
    small_client: TestClient, settings: Settings, data: bytes
) -> None:
    code, body = _upload(small_client, data)
    assert code == 422, body
    assert "deeper than 32 folders or longer than 1024 bytes" in body["detail"], body
    assert list((settings.data_root / "uploads").iterdir()) == []


def test_a_dataset_with_a_deep_tree_is_deleted_with_its_files(
    small_client: TestClient, settings: Settings, factory
) -> None:
    """A tree 1,500 folders deep under a dataset's upload (as archives extracted before
    the depth limit left them) goes with the dataset: no recursion, no path too long."""
    from sqlalchemy import update

    from maskops_core.db.models import Job

    code, body = _upload(small_client, zip_bytes(ARCHIVE_LAYOUT))
    assert code == 201, body
    with factory() as session:
        session.execute(update(Job).values(status="failed"))
        session.commit()
    upload = settings.data_root / "uploads" / Path(body["splits"]["train"]["image_dir"]).parts[1]
    fd = os.open(upload, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):  # each level opened from the one above: no path is ever long
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    response = small_client.delete(f"/datasets/{body['id']}")
    assert response.status_code == 204, response.text
    assert not upload.exists()
    assert list((settings.data_root / "uploads").iterdir()) == []


@pytest.mark.parametrize(
    ("files", "message"),
    [
        # curl -F file=@d.zip: a binary archive read as a text field was "not UTF-8", one
        # above 64 KiB a 413 for a "form field".
        ({"file": ("d.zip", zip_bytes(ARCHIVE_LAYOUT))}, "form part 'file' is a file"),
        ({"file": ("d.zip", b"PK" + bytes(range(256)) * 300)}, "form part 'file' is a file"),
        # curl -F archive=d.zip: the file's name sent as text.
        ({"archive": (None, "d.zip")}, "archive: a file is expected, not text"),
    ],
)
def test_an_archive_in_the_wrong_part_is_named(
    small_client: TestClient, settings: Settings, files: dict, message: str
) -> None:
    response = small_client.post("/datasets/upload", data={"name": "up"}, files=files)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(message), response.text
    assert list((settings.data_root / "uploads").iterdir()) == []
    assert small_client.get("/datasets").json()["total"] == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # A misspelt field was dropped: the dataset was made with the default it meant to
        # replace (here: 8 shards).
        ({"num_shard": "2"}, "num_shard: Extra inputs are not permitted"),
        # An absolute path was read inside the archive (a 404 naming "uploads/<id>/x").
        ({"train_image_dir": "/images/train"}, "train_image_dir: Value error, must be a path"),
        ({"val_annotation_file": "../v.json"}, "val_annotation_file: Value error, must be"),
    ],
)
def test_form_fields_are_checked_as_documented(
    small_client: TestClient, settings: Settings, fields: dict, message: str
) -> None:
    response = small_client.post(
        "/datasets/upload",
        data={"name": "up", **fields},
        files={"archive": ("d.zip", zip_bytes(ARCHIVE_LAYOUT))},
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(message), response.text
    assert list((settings.data_root / "uploads").iterdir()) == []
    assert small_client.get("/datasets").json()["total"] == 0
