"""Property-based API testing with schemathesis against the committed OpenAPI document:
no 5xx, every response conforms to the document, and schema-valid requests are accepted
(but for the few operations in ``BEYOND_THE_SCHEMA``). The app runs in-process on SQLite
with auth required (as when it listens beyond loopback), so the auth checks apply too."""

from __future__ import annotations

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis import checks
from schemathesis.core.result import Ok

from maskops_api.main import create_app
from maskops_api.openapi import DEFAULT_OUT
from maskops_api.routers.uploads import ARCHIVE_MEDIA_TYPES
from maskops_api.services.tokens import create_token
from maskops_core.db.models import TokenScope
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.unit.api.conftest import (
    ARCHIVE_LAYOUT,
    DATASET_BODY,
    SMALL_SPEC,
    RecordingDispatcher,
    tar_bytes,
    zip_bytes,
)

EXAMPLES_PER_OPERATION = 20
BEYOND_THE_SCHEMA = {
    "POST /experiments": "a spec: TAO text, and limits across fields (memory, levels)",
    "PUT /experiments/{experiment_id}": "a spec, as POST /experiments",
    "POST /jobs": "each action's parent kinds and options (the action catalogue)",
    "POST /infer": "JPEG/PNG bytes, which schemathesis sends as text parts for an array",
}
"""Operations whose schema-valid bodies the server may still refuse (422/415) for what no
JSON Schema in the document says; every other operation accepts every schema-valid request
(check ``positive_data_acceptance``)."""


def _archives() -> st.SearchStrategy[bytes]:
    """Upload archives as the document's encoding names them (schemathesis would send any
    bytes). Extracted, then a 404: they hold no train images. A registered upload would
    queue a job, and ``GET /jobs/{id}/logs?follow=true`` drawn with its id streams until
    the job ends (never here)."""
    members = {k: v for k, v in ARCHIVE_LAYOUT.items() if not k.startswith("images/train/")}
    return st.sampled_from([zip_bytes(members), tar_bytes(members)])


def test_api_conforms_and_never_5xx(settings: Settings) -> None:
    exposed = settings.model_copy(update={"auth": "required"})
    engine = make_engine(exposed)
    with make_session_factory(engine)() as session:
        _, secret = create_token(session, name="schemathesis", scope=TokenScope.admin)
    engine.dispose()
    auth = {"Authorization": f"Bearer {secret}"}
    app = create_app(exposed, dispatcher=RecordingDispatcher())
    for media_type in ARCHIVE_MEDIA_TYPES:
        schemathesis.openapi.media_type(media_type, _archives())
    with TestClient(app, headers=auth) as client:
        # Resources to find: a dataset with its convert job, an experiment.
        dataset = client.post("/datasets", json=DATASET_BODY).json()
        client.post(
            "/experiments", json={"name": "e", "dataset_id": dataset["id"], "spec": SMALL_SPEC}
        )
        schema = schemathesis.openapi.from_path(DEFAULT_OUT)
        schema.app = app
        operations = [r.ok() for r in schema.get_all_operations() if isinstance(r, Ok)]
        assert len(operations) >= 15
        for operation in operations:

            @given(case=operation.as_strategy())
            @hypothesis_settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case) -> None:
                if case.path == "/jobs/{job_id}/logs" and case.query:
                    # Following a queued job's log streams until the job ends, which no
                    # worker here makes happen (following is tested with a real worker).
                    case.query["follow"] = False
                response = case.call(headers=auth)
                # No Triton and no worker run here: /infer and /readyz answer their documented
                # 503 (both are tested with the real services in tests/integration/api).
                unavailable = case.path in ("/infer", "/readyz") and response.status_code == 503
                assert response.status_code < 500 or unavailable, (
                    f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
                )
                excluded = [
                    *([checks.not_a_server_error] if unavailable else []),
                    *(
                        [checks.positive_data_acceptance]
                        if case.operation.label in BEYOND_THE_SCHEMA
                        else []
                    ),
                ]
                case.validate_response(response, excluded_checks=excluded)

            check()
        assert set(BEYOND_THE_SCHEMA) <= {operation.label for operation in operations}
