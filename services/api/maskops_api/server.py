"""The API process of a deployment: apply migrations, then serve (with the reconciler).

``python -m maskops_api.server`` is the API container's command; host and port come from
``MASKOPS_HOST`` / ``MASKOPS_PORT``.
"""

from __future__ import annotations

import gc
import logging
import os

import uvicorn

from maskops_api.main import create_app
from maskops_core.db.migrate import upgrade_head
from maskops_core.settings import get_settings


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = get_settings()
    upgrade_head(settings)
    app = create_app(settings, run_reconciler=True)
    # Everything built so far lives as long as the process: out of the collector's sight,
    # full collections no longer walk it, which took milliseconds off the slowest polls.
    gc.freeze()
    uvicorn.run(
        app,
        host=settings.host,
        port=int(os.environ.get("MASKOPS_PORT", "8080")),
        access_log=settings.access_log,
    )


if __name__ == "__main__":
    main()
