"""Datasets registered in other labelling tools' formats over REST: a file in another
format is a 422 naming the layout expected; a zip of LabelMe files with a malformed one
converts the rest (the real worker action, run in-process), reports that file, and the
converted COCO file downloads."""

from __future__ import annotations

import io
import json

from fastapi.testclient import TestClient
from PIL import Image

from maskops_core.settings import Settings
from maskops_worker.runner import run_job
from tests.unit.api.conftest import zip_bytes


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (120, 60, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def _labelme(image: str, label: str) -> bytes:
    shape = {"label": label, "points": [[2, 2], [20, 2], [20, 18]], "shape_type": "polygon"}
    record = {"shapes": [shape], "imagePath": f"../images/{image}"}
    return json.dumps(record | {"imageWidth": 32, "imageHeight": 24}).encode()


def test_a_file_in_another_format_is_a_422_naming_the_layout(
    client: TestClient, settings: Settings
) -> None:
    via = {"a.png-1": {"filename": "a.png", "size": 1, "regions": []}}
    (settings.data_root / "shapes" / "via.json").write_text(json.dumps(via))
    body = {
        "name": "mislabelled",
        "format": "labelstudio",
        "train": {"image_dir": "shapes/images/train", "annotation_file": "shapes/via.json"},
    }
    response = client.post("/datasets", json=body)
    assert response.status_code == 422, response.text
    assert "expected a Label Studio JSON export" in response.json()["detail"]
    folder = client.post("/datasets", json=body | {"format": "voc"})
    assert folder.status_code == 422 and "expected a Pascal VOC folder" in folder.json()["detail"]
    unknown = client.post("/datasets", json=body | {"format": "pascal"})
    assert unknown.status_code == 422 and "yolo-seg" in unknown.text


def test_labelme_zip_with_a_malformed_file_converts_the_rest(
    client: TestClient, settings: Settings
) -> None:
    members = {
        "images/a.png": _png(),
        "images/b.png": _png(),
        "labelme/a.json": _labelme("a.png", "cat"),
        "labelme/b.json": _labelme("b.png", "dog"),
        "labelme/c.json": b'{"shapes": [{"label": ',
    }
    response = client.post(
        "/datasets/upload",
        data={
            "name": "pets",
            "format": "labelme",
            "labels": "dog, cat",
            "train_image_dir": "images",
            "train_annotation_file": "labelme",
        },
        files={"archive": ("pets.zip", zip_bytes(members))},
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert (created["format"], created["labels"]) == ("labelme", ["dog", "cat"])
    assert set(created["splits"]) == {"train"}

    assert run_job(created["convert_job_id"], settings=settings) == "succeeded"
    dataset = client.get(f"/datasets/{created['id']}").json()
    assert dataset["counts"]["train"]["images"] == 2
    assert dataset["counts"]["train"]["annotations"] == 2
    assert dataset["label_map"] == [
        {"id": 1, "name": "dog", "label": 1},
        {"id": 2, "name": "cat", "label": 2},
    ]
    (train,) = dataset["warnings"]
    assert train["counts"] == {"malformed_record": 1}
    assert "c.json" in train["images"]["c.json"]["malformed_record"][0]

    coco = client.get(f"/datasets/{created['id']}/coco/train")
    assert coco.status_code == 200
    document = coco.json()
    assert [im["file_name"] for im in document["images"]] == ["a.png", "b.png"]
    assert document["categories"] == [{"id": 1, "name": "dog"}, {"id": 2, "name": "cat"}]
    assert client.get(f"/datasets/{created['id']}/coco/val").status_code == 404
