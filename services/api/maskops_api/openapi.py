"""Write the app's OpenAPI document: ``python -m maskops_api.openapi [OUT]``.

The committed ``openapi/openapi.json`` is this output; a test fails when they differ.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from maskops_api.main import create_app
from maskops_core.settings import Settings

DEFAULT_OUT = Path(__file__).resolve().parents[3] / "openapi" / "openapi.json"


class _NoDispatch:
    def send(self, *, action: str, job_id: int, queue: str, task_id: str, database: str) -> None:
        raise RuntimeError("the OpenAPI dump sends nothing")


def openapi_document() -> dict[str, Any]:
    """The document, independent of the environment (no database is opened)."""
    settings = Settings(database_url="sqlite://", _env_file=None)  # type: ignore[call-arg]
    document: dict[str, Any] = create_app(settings, dispatcher=_NoDispatch()).openapi()
    return document


def render() -> str:
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else DEFAULT_OUT
    out.write_text(render())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
