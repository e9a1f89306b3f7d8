"""Property-based API testing with schemathesis against the committed OpenAPI document:
no 5xx, every response conforms to the document, and schema-valid requests are accepted
(check ``positive_data_acceptance``, on every operation). The app runs in-process on SQLite
with auth required (as when it listens beyond loopback), so the auth checks apply too.

Two kinds of value no JSON Schema can describe are drawn by schemathesis' own means:
archives and images by the media types the document names for their parts, and the
experiment specs (TAO text, or JSON held to rules across fields) by a ``flatmap_body`` hook
of this schema that replaces the drawn spec with one the server must accept; the same hook
puts an export job's batch sizes in the order the server requires."""

from __future__ import annotations

import io
from typing import Any, cast

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from PIL import Image
from schemathesis import checks
from schemathesis.core.result import Ok

from maskops.spec.models import BACKBONE_MIN_LEVELS, MAX_LEVEL_LIMIT, MIN_IMAGE_SIDE, NLAYERS
from maskops_api import specs
from maskops_api.main import create_app
from maskops_api.openapi import DEFAULT_OUT
from maskops_api.routes.infer import IMAGE_MEDIA_TYPES
from maskops_api.routes.uploads import ARCHIVE_MEDIA_TYPES
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
SPEC_BODIES = {"POST /experiments", "PUT /experiments/{experiment_id}"}


def _archives() -> st.SearchStrategy[bytes]:
    """Upload archives as the document's encoding names them (schemathesis would send any
    bytes). Extracted, then a 404: they hold no train images. A registered upload would
    queue a job, and ``GET /jobs/{id}/logs?follow=true`` drawn with its id streams until
    the job ends (never here)."""
    members = {k: v for k, v in ARCHIVE_LAYOUT.items() if not k.startswith("images/train/")}
    return st.sampled_from([zip_bytes(members), tar_bytes(members)])


@st.composite
def _specs(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A spec the server must accept, as JSON and as TAO text: fields drawn within the
    engine's rules (levels, image sides multiple of 2^max_level) and this server's limits
    (maskops_api.specs)."""
    min_level = draw(st.integers(*BACKBONE_MIN_LEVELS))
    max_level = draw(st.integers(min_level + 1, MAX_LEVEL_LIMIT))
    stride = 2**max_level
    sides = st.integers(-(-MIN_IMAGE_SIDE // stride), specs.MAX_IMAGE_SIDE // stride)
    height, width = draw(sides) * stride, draw(sides) * stride
    batches = st.integers(1, min(specs.MAX_BATCH_SIZE, specs.MAX_BATCH_PIXELS // (height * width)))
    top = {
        "total_steps": draw(st.integers(1, 10**6)),
        "train_batch_size": draw(batches),
        "eval_batch_size": draw(batches),
        "init_learning_rate": draw(st.floats(1e-6, 1.0)),
    }
    data = {
        "image_size": [height, width],
        "num_classes": draw(st.integers(2, specs.MAX_NUM_CLASSES)),
        "max_num_instances": draw(st.integers(1, specs.MAX_INSTANCES)),
    }
    model = {"nlayers": draw(st.sampled_from(NLAYERS)), "min_level": min_level}
    model["max_level"] = max_level
    text = "".join(f"{k}: {v!r}\n" for k, v in top.items())
    text += f'data_config {{\n  image_size: "({height}, {width})"\n'
    text += "".join(f"  {k}: {v}\n" for k, v in data.items() if k != "image_size") + "}\n"
    text += "maskrcnn_config {\n" + "".join(f"  {k}: {v}\n" for k, v in model.items()) + "}\n"
    return {**top, "data_config": data, "maskrcnn_config": model}, text


def _valid_specs(_: Any, body: Any) -> st.SearchStrategy[Any]:
    """``flatmap_body`` for the experiment routes: the drawn body with a drawn valid spec
    in place of whichever of ``spec``/``spec_text`` it gives (the rest as drawn)."""
    if not isinstance(body, dict):
        return st.just(body)

    def fill(spec: tuple[dict[str, Any], str]) -> dict[str, Any]:
        filled = dict(body)
        if filled.get("spec") is not None:
            filled["spec"] = spec[0]
        if filled.get("spec_text") is not None:
            filled["spec_text"] = spec[1]
        return filled

    return _specs().map(fill)


BATCH_FIELDS = ("min_batch_size", "opt_batch_size", "max_batch_size")


def _export_batches_in_order(body: Any) -> Any:
    """An export job's batch sizes put in the order the door requires (min <= opt <= max,
    none beside a static batch), a rule across fields no JSON Schema states."""
    options = body.get("options") if isinstance(body, dict) else None
    if not isinstance(options, dict) or body.get("action") != "export":
        return body
    options = dict(options)
    if options.get("static_batch_size") is not None:
        options = {k: v for k, v in options.items() if k not in BATCH_FIELDS[:2]}
    else:
        given = [k for k in BATCH_FIELDS if options.get(k) is not None]
        # Without max_batch_size its default (16) bounds the others.
        cap = None if "max_batch_size" in given else 16
        values = sorted(options[k] if cap is None else min(options[k], cap) for k in given)
        options.update(zip(given, values, strict=True))
    return {**body, "options": options}


def _images(settings: Settings) -> st.SearchStrategy[bytes]:
    """The ``images`` of /infer: 1 to the server's limit of small JPEGs and PNGs
    (schemathesis would send any bytes for parts of these media types).

    schemathesis draws an encoded property whole from its media type's strategy, typed as
    bytes: for this array, a list of images, each sent as a file part."""

    def encoded(size: tuple[int, int], kind: str) -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", size, (40, 90, 160)).save(buffer, format=kind)
        return buffer.getvalue()

    # Within the aspect-ratio limit (a narrower image is a 422 by design).
    aspect = settings.max_infer_image_aspect
    sizes = st.tuples(st.integers(1, 64), st.integers(1, 64)).filter(
        lambda wh: max(wh) <= aspect * min(wh)
    )
    image = st.builds(encoded, sizes, st.sampled_from(["JPEG", "PNG"]))
    images = st.lists(image, min_size=1, max_size=settings.max_infer_images)
    return cast("st.SearchStrategy[bytes]", images)


def test_api_conforms_and_never_5xx(settings: Settings) -> None:
    # schemathesis calls the app as http://testserver: a name this server is told to serve.
    exposed = settings.model_copy(update={"auth": "required", "allowed_hosts": ["testserver"]})
    engine = make_engine(exposed)
    with make_session_factory(engine)() as session:
        _, secret = create_token(session, name="schemathesis", scope=TokenScope.admin)
    engine.dispose()
    auth = {"Authorization": f"Bearer {secret}"}
    app = create_app(exposed, dispatcher=RecordingDispatcher())
    for media_type in ARCHIVE_MEDIA_TYPES:
        schemathesis.openapi.media_type(media_type, _archives())
    for media_type in IMAGE_MEDIA_TYPES:
        schemathesis.openapi.media_type(media_type, _images(exposed))
    with TestClient(base_url="http://localhost", app=app, headers=auth) as client:
        # Resources to find: a dataset with its convert job, an experiment.
        dataset = client.post("/datasets", json=DATASET_BODY).json()
        client.post(
            "/experiments", json={"name": "e", "dataset_id": dataset["id"], "spec": SMALL_SPEC}
        )
        schema = schemathesis.openapi.from_path(DEFAULT_OUT)
        schema.app = app

        @schema.hook
        def flatmap_body(context: Any, body: Any) -> st.SearchStrategy[Any]:
            operation = context.operation
            spec_body = operation is not None and operation.label in SPEC_BODIES
            if spec_body:
                return _valid_specs(context, body)
            return st.just(_export_batches_in_order(body))

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
                case.validate_response(
                    response, excluded_checks=[checks.not_a_server_error] if unavailable else None
                )

            check()
        assert {operation.label for operation in operations} >= SPEC_BODIES
