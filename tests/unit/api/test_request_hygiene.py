"""Small things a tester found at the door: wrong-typed values are refused rather than
coerced, names take no control characters, every unparsable JSON body is the documented
422, a 405 lists the methods that work, and messages name paths as the client gave them."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from maskops_core.settings import Settings
from tests.unit.api.conftest import DATASET_BODY, SMALL_SPEC

JSON = {"Content-Type": "application/json"}


def test_integral_floats_are_integers(client: TestClient) -> None:
    response = client.post("/jobs", json={"action": "evaluate", "parent_job_id": 7.0})
    assert (response.status_code, response.json()["detail"]) == (404, "parent job 7 not found")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/jobs", {"action": "train", "experiment_id": "1"}, "experiment_id"),
        # 1.0 is an integer to JSON Schema (and so to the OpenAPI document); 1.5 is not.
        ("/jobs", {"action": "evaluate", "parent_job_id": 1.5}, "parent_job_id"),
        ("/datasets", {**DATASET_BODY, "num_shards": True}, "num_shards"),
        ("/datasets", {**DATASET_BODY, "include_masks": "yes"}, "include_masks"),
        ("/experiments", {"name": "e", "dataset_id": "1", "spec": SMALL_SPEC}, "dataset_id"),
    ],
)
def test_wrong_types_are_not_coerced(client: TestClient, path: str, body: dict, field: str) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(f"{field}: ")


@pytest.mark.parametrize("name", ["a\x00b", "tab\there", "bell\x07"])
def test_names_with_control_characters_are_refused(client: TestClient, name: str) -> None:
    response = client.post("/datasets", json={**DATASET_BODY, "name": name})
    assert response.status_code == 422 and "control characters" in response.json()["detail"]
    assert client.get("/datasets").json()["total"] == 0
    response = client.post("/experiments", json={"name": name, "spec": SMALL_SPEC})
    assert response.status_code == 422 and "control characters" in response.json()["detail"]


@pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u200b", "\ufeff"])
def test_names_with_bidi_controls_or_invisible_characters_are_refused(
    client: TestClient, char: str
) -> None:
    """U+202E shows "exe.txt" for "txt.exe"; U+200B and U+FEFF make look-alike names."""
    name = f"cats{char}txt.exe"
    code = f"U+{ord(char):04X}"
    response = client.post("/datasets", json={**DATASET_BODY, "name": name})
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("name: ") and code in response.text
    response = client.post("/experiments", json={"name": name, "spec": SMALL_SPEC})
    assert response.status_code == 422 and response.json()["detail"].startswith("name: ")
    created = client.post("/experiments", json={"name": "cats", "spec": SMALL_SPEC})
    assert created.status_code == 201, created.text
    response = client.put(f"/experiments/{created.json()['id']}", json={"name": name})
    assert response.status_code == 422 and response.json()["detail"].startswith("name: ")
    assert [e["name"] for e in client.get("/experiments").json()["items"]] == ["cats"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"name": "\xff\xfe"}', "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        # Not "9: JSON decode error", which read as a field named 9.
        (b'{"name": ', "body: not valid JSON (Expecting value at character 9)"),
        (b'{"name": "e",}', "body: not valid JSON (Expecting property name enclosed in "),
    ],
)
def test_unparsable_json_is_422(client: TestClient, body: bytes, says: str) -> None:
    response = client.post("/experiments", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    assert says in response.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/datasets", "GET, POST"),
        ("PUT", "/jobs", "GET, POST"),
        ("PATCH", "/experiments/1", "DELETE, GET, PUT"),
        ("GET", "/datasets/upload", "POST"),
    ],
)
def test_405_lists_every_method_of_the_path(
    client: TestClient, method: str, path: str, allowed: str
) -> None:
    response = client.request(method, path)
    assert response.status_code == 405, response.text
    assert response.headers["Allow"] == allowed


def test_path_errors_name_no_server_path(client: TestClient, settings: Settings) -> None:
    body = {**DATASET_BODY, "train": {"image_dir": "x" * 5000, "annotation_file": "a.json"}}
    response = client.post("/datasets", json=body)
    assert response.status_code == 404, response.text  # a path that names nothing
    assert str(settings.data_root) not in response.text
    assert response.json()["detail"] == "train: file name too long"
