"""Requests that are themselves bad are a 4xx naming the member, file or field, never a
500, against the real app on Postgres and Redis (no worker: nothing here reaches one)."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from fastapi.testclient import TestClient

from maskops_core.settings import Settings
from tests.integration.api.test_door_checks import COCO, SPEC, tiny_dataset

pytestmark = pytest.mark.integration


def test_automl_options_are_bounded_in_size_as_job_options_are(
    client: TestClient, clean_db: Settings
) -> None:
    dataset = tiny_dataset(client, clean_db)
    experiment = client.post(
        "/experiments", json={"name": "e", "dataset_id": dataset["id"], "spec": SPEC}
    ).json()
    options = {"algorithm": "random", "note": "x" * (64 * 1024)}
    response = client.post("/automl", json={"experiment_id": experiment["id"], "options": options})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("options: ") and "at most 65536 bytes as JSON" in detail, detail
    assert client.get("/jobs").json()["total"] == 1  # the dataset's conversion only


def _zip(members: dict[str, bytes], *, flag_bits: int = 0, method: int | None = None) -> bytes:
    """A zip of ``members`` whose last member's central-directory entry (what readers
    trust) declares ``flag_bits`` and, when given, the compression ``method``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    data = bytearray(buffer.getvalue())
    entry = data.rindex(b"PK\x01\x02")
    data[entry + 8] |= flag_bits
    if method is not None:
        data[entry + 10 : entry + 12] = method.to_bytes(2, "little")
    return bytes(data)


LAYOUT = {"images/train/1.jpg": b"x", "annotations/train.json": json.dumps(COCO).encode()}


@pytest.mark.parametrize(
    ("flag_bits", "method", "message"),
    [(0x1, None, "encrypted"), (0, 99, "compression method 99 is not supported")],
)
def test_zip_members_zipfile_cannot_read_are_422_naming_the_member(
    client: TestClient, clean_db: Settings, flag_bits: int, method: int | None, message: str
) -> None:
    archive = _zip({**LAYOUT, "images/train/2.jpg": b"y"}, flag_bits=flag_bits, method=method)
    response = client.post(
        "/datasets/upload", data={"name": "up"}, files={"archive": ("d.zip", archive)}
    )
    assert response.status_code == 422, response.text
    assert f"member 'images/train/2.jpg': {message}" in response.json()["detail"]
    assert not any((clean_db.data_root / "uploads").iterdir())


@pytest.mark.parametrize(
    ("format_name", "text", "expected"),
    [
        ("labelstudio", "[" * 100_000 + "]" * 100_000, "a Label Studio JSON export"),
        ("via", '{"a": ' * 100_000 + "1" + "}" * 100_000, "a VIA JSON export"),
    ],
)
def test_deeply_nested_json_is_422_naming_the_file(
    client: TestClient, clean_db: Settings, format_name: str, text: str, expected: str
) -> None:
    (clean_db.data_root / "deep" / "images").mkdir(parents=True, exist_ok=True)
    (clean_db.data_root / "deep" / "tasks.json").write_text(text)
    train = {"image_dir": "deep/images", "annotation_file": "deep/tasks.json"}
    response = client.post(
        "/datasets", json={"name": "deep", "format": format_name, "train": train}
    )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("train.annotation_file: 'deep/tasks.json': expected " + expected)
