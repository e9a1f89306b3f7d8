"""``/healthz`` (the process answers), ``/readyz`` (database, worker, broker, Triton),
``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.deps import FactoryDep, SettingsDep
from maskops_api.schemas import Health
from maskops_api.serving.published import published_names
from maskops_api.serving.replicas import Readiness, readiness
from maskops_core.paths import disk_problem
from maskops_core.settings import Settings
from maskops_core.workers import check_workers

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, response_model_exclude_none=True)
async def healthz() -> Health:
    return Health(status="ok")


def check_broker(settings: Settings) -> str:
    from kombu import Connection

    try:
        with Connection(settings.broker_url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}"


def check_worker(session: Session, settings: Settings, supervisor: Any) -> str:
    """A queue with work and no live worker; under ``maskops serve`` also a worker process
    that is down or has not beaten yet (the supervisor knows which one should)."""
    if supervisor is None:
        return check_workers(session, settings)
    return supervisor.worker.problem or check_workers(
        session, settings, expected_pid=supervisor.worker.pid
    )


def published_or_none(factory: sessionmaker[Session]) -> list[str]:
    """The published models each replica must serve; none when the database does not
    answer (the database check says so)."""
    try:
        return published_names(factory)
    except Exception:
        return []


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request, settings: SettingsDep, factory: FactoryDep) -> JSONResponse:
    supervisor = getattr(request.app.state, "supervisor", None)
    checks: dict[str, str] = {}
    try:
        with factory() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    try:
        with factory() as session:
            checks["worker"] = check_worker(session, settings, supervisor)
    except Exception as exc:
        checks["worker"] = f"unknown (the database did not answer: {type(exc).__name__})"
    checks["broker"] = check_broker(settings)
    disk = disk_problem(settings.data_root, settings.min_free_disk_bytes)
    if disk != "ok":  # reported only when short, so the usual answer stays as it was
        checks["disk"] = disk
    triton = None if supervisor is None else supervisor.triton
    replicas: Readiness | None = None
    if triton is not None and triton.problem:
        checks["triton"] = triton.problem
    elif settings.has_triton:
        replicas = readiness(request.app.state, published_or_none(factory))
        checks["triton"] = replicas.summary
    # One Triton replica down of several degrades the service but does not stop it.
    failing = {name for name, value in checks.items() if value != "ok"}
    serving = not failing or (failing == {"triton"} and replicas is not None and replicas.serving)
    body = Health(
        status="ok" if not failing else "degraded",
        checks=checks,
        triton_replicas=replicas.replicas if replicas else None,
    )
    return JSONResponse(body.model_dump(exclude_none=True), status_code=200 if serving else 503)


@router.get(
    "/metrics",
    response_model=None,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    include_in_schema=True,
)
def metrics(request: Request) -> Response:
    """Prometheus text format: request latency, jobs by state, queue depth."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
