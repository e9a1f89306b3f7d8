"""The FastAPI application: ``create_app(settings)``, and ``app`` for uvicorn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from maskops_api.cache.job_cache import JobCache
from maskops_api.cache.token_cache import CHANNEL as TOKEN_CHANNEL
from maskops_api.cache.token_cache import TokenCache
from maskops_api.dashboard import install_dashboard
from maskops_api.docs_ui import install_docs_ui
from maskops_api.errors import install_handlers
from maskops_api.in_flight import KeysInFlight
from maskops_api.middleware.body_limit import BodyLimit
from maskops_api.middleware.observability import install_metrics
from maskops_api.middleware.origin_guard import OriginGuard
from maskops_api.middleware.status_shortcut import JobStatusShortcut
from maskops_api.reconciler import ReconcilerThread
from maskops_api.routes import automl, datasets, experiments, health, infer, jobs, models
from maskops_api.streams import StreamSlots
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.dispatch import CeleryDispatcher, Dispatcher
from maskops_core.settings import Settings, get_settings

DESCRIPTION = """\
The maskops control plane: register datasets, create experiments from TAO specs (JSON or
TAO text), launch jobs (dataset_convert, train, evaluate, prune, inference, export), follow
their progress, logs and metrics, publish models and run inference.

When the server listens beyond loopback every route but `/healthz`, `/readyz` and `/metrics`
needs `Authorization: Bearer <token>` (create one with `maskops token create`).
"""


def create_app(
    settings: Settings | None = None,
    *,
    dispatcher: Dispatcher | None = None,
    run_reconciler: bool = False,
) -> FastAPI:
    """Build the app. ``run_reconciler`` starts the background reconciler with the app."""
    settings = settings or get_settings()
    engine = make_engine(settings)
    factory = make_session_factory(engine)
    dispatch = dispatcher or CeleryDispatcher(settings)
    job_cache = JobCache(engine, schema=settings.database_schema)
    # Verified tokens in memory, dropped on the job cache's notification connection.
    token_cache = TokenCache(factory, schema=settings.database_schema)
    job_cache.subscribe(TOKEN_CHANNEL, token_cache)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        reconciler = ReconcilerThread(factory, dispatch, settings) if run_reconciler else None
        if reconciler is not None:
            reconciler.start()
        job_cache.start()
        try:
            yield
        finally:
            job_cache.stop()
            token_cache.close()
            if reconciler is not None:
                reconciler.stop()
            engine.dispose()

    app = FastAPI(
        title="maskops",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.session_factory = factory
    app.state.dispatcher = dispatch
    app.state.job_cache = job_cache
    app.state.token_cache = token_cache
    app.state.keys_in_flight = KeysInFlight()
    app.state.log_followers = StreamSlots(
        settings.max_log_followers, what="log streams", setting="MASKOPS_MAX_LOG_FOLLOWERS"
    )
    install_handlers(app)
    install_docs_ui(app)
    install_dashboard(app)
    # Added before the metrics middleware, so that it sits inside it and is timed too.
    app.add_middleware(BodyLimit, settings=settings)
    app.add_middleware(JobStatusShortcut, cache=job_cache, settings=settings, tokens=token_cache)
    install_metrics(app, factory, settings, job_cache, token_cache)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )
    # Last added, so outermost: nothing (not the status shortcut) answers a refused request.
    app.add_middleware(OriginGuard, settings=settings)
    for module in (health, datasets, experiments, jobs, automl, models, infer):
        app.include_router(module.router)
    return app


def __getattr__(name: str) -> FastAPI:
    # ``uvicorn maskops_api.main:app`` builds the app from the environment on first access,
    # so importing this module (tests, the OpenAPI dump) has no side effects.
    if name == "app":
        return create_app(run_reconciler=True)
    raise AttributeError(name)
