"""Database errors a request can meet are 4xx/503 answers with a message, never a 500."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError

from maskops_api.main import create_app
from maskops_core.settings import Settings
from tests.unit.api.conftest import RecordingDispatcher


def test_a_write_whose_reference_vanished_is_a_409(settings: Settings) -> None:
    """E.g. a job created while its dataset is deleted: the foreign key fails at commit."""
    app = create_app(settings, dispatcher=RecordingDispatcher())

    def vanished() -> None:
        raise IntegrityError("INSERT INTO jobs ...", {}, Exception("foreign key violation"))

    app.add_api_route("/_test/vanished", vanished, methods=["POST"])
    with TestClient(base_url="http://localhost", app=app, raise_server_exceptions=False) as client:
        answer = client.post("/_test/vanished")
    assert answer.status_code == 409
    assert answer.json() == {
        "detail": "a resource this request refers to changed meanwhile; try again"
    }
