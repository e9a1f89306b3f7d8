"""The committed OpenAPI document matches the app, and Swagger shows examples for bodies."""

from __future__ import annotations

import json

from maskops_api.openapi import DEFAULT_OUT, openapi_document, render


def test_committed_openapi_matches_the_app() -> None:
    committed = DEFAULT_OUT.read_text()
    assert committed == render(), (
        "openapi/openapi.json is out of date: run `.venv/bin/python -m maskops_api.openapi`"
    )


def test_every_request_body_has_an_example_including_tao_text() -> None:
    document = openapi_document()
    schemas = document["components"]["schemas"]
    bodies = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            content = operation.get("requestBody", {}).get("content", {})
            # Multipart bodies (POST /infer) are file choosers in Swagger UI.
            for media_type, media in content.items():
                if media_type != "application/json":
                    continue
                ref = media["schema"]["$ref"].rsplit("/", 1)[-1]
                bodies.append((method, path, ref))
                assert schemas[ref].get("examples"), f"{method} {path}: {ref} has no example"
    assert {b[2] for b in bodies} >= {"DatasetCreate", "ExperimentCreate", "JobCreate"}
    texts = [e.get("spec_text", "") for e in schemas["ExperimentCreate"]["examples"]]
    assert any("maskrcnn_config {" in t for t in texts)


def test_openapi_is_valid_json_with_the_resources() -> None:
    document = json.loads(DEFAULT_OUT.read_text())
    assert {"/jobs", "/jobs/{job_id}", "/datasets", "/experiments", "/healthz", "/readyz"} <= set(
        document["paths"]
    )
