"""Control-plane unit tests: the real app, migrations and runner on a SQLite database.

The broker is replaced by a dispatcher that records what would be sent (these tests check
the control plane's own decisions; tests/integration/api runs the real broker and worker).
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from fastapi.testclient import TestClient

from maskops_api.main import create_app
from maskops_core.settings import Settings


@dataclass
class RecordingDispatcher:
    sent: list[tuple[str, int, str, str]] = field(default_factory=list)
    fail: bool = False

    def send(self, *, action: str, job_id: int, queue: str, task_id: str, database: str) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append((action, job_id, queue, task_id))


@pytest.fixture
def dispatcher() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def client(settings: Settings, dispatcher: RecordingDispatcher) -> Iterator[TestClient]:
    with TestClient(
        base_url="http://localhost", app=create_app(settings, dispatcher=dispatcher)
    ) as test_client:
        yield test_client


DATASET_BODY = {
    "name": "shapes",
    "train": {
        "image_dir": "shapes/images/train",
        "annotation_file": "shapes/annotations/train.json",
    },
    "val": {"image_dir": "shapes/images/val", "annotation_file": "shapes/annotations/val.json"},
    "num_shards": 2,
}

SMALL_SPEC = {
    "total_steps": 4,
    "train_batch_size": 1,
    "data_config": {"image_size": [128, 128], "num_classes": 4},
    "maskrcnn_config": {"nlayers": 10},
}


COCO = json.dumps({"images": [], "annotations": [], "categories": []}).encode()


def zip_bytes(members: dict[str, bytes], *, symlink: str | None = None) -> bytes:
    """A zip of ``members``; ``symlink`` adds a link of that name to /etc/passwd."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = 0o120777 << 16
            archive.writestr(info, "/etc/passwd")
    return buffer.getvalue()


def tar_bytes(
    members: dict[str, bytes], *, symlink: str | None = None, compression: str = "gz"
) -> bytes:
    """A tar of ``members`` (``compression``: gz, bz2, xz, or "" for none); ``symlink`` adds
    a link of that name to /etc."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=f"w:{compression}") as archive:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        if symlink:
            link = tarfile.TarInfo(symlink)
            link.type = tarfile.SYMTYPE
            link.linkname = "/etc"
            archive.addfile(link)
    return buffer.getvalue()


ARCHIVE_LAYOUT = {
    "images/train/1.jpg": b"x",
    "annotations/train.json": COCO,
    "images/val/2.jpg": b"y",
    "annotations/val.json": COCO,
}
"""A dataset archive's members at the upload form's default paths."""
