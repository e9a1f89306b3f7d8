"""Prometheus metrics: request latency per route, jobs by state and queue depth at scrape."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from maskops_api.db.models import Job
from maskops_api.settings import Settings


class StateCollector(Collector):
    def __init__(self, factory: sessionmaker[Session], settings: Settings) -> None:
        self.factory = factory
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "maskops_jobs", "Jobs by state and action", labels=["status", "action"]
        )
        try:
            with self.factory() as session:
                rows = session.execute(
                    select(Job.status, Job.action, func.count()).group_by(Job.status, Job.action)
                ).all()
            for status, action, count in rows:
                jobs.add_metric([status, action], count)
        except Exception:
            pass
        yield jobs
        depth = GaugeMetricFamily(
            "maskops_queue_depth", "Messages waiting per queue", labels=["queue"]
        )
        if self.settings.broker_url.startswith(("redis://", "rediss://")):
            try:
                import redis

                client = redis.Redis.from_url(self.settings.broker_url, socket_timeout=1)
                for queue in (self.settings.gpu_queue, self.settings.cpu_queue):
                    depth.add_metric([queue], client.llen(queue))
                client.close()
            except Exception:
                pass
        yield depth


def install_metrics(app: FastAPI, factory: sessionmaker[Session], settings: Settings) -> None:
    registry = CollectorRegistry()
    latency = Histogram(
        "maskops_http_request_seconds",
        "HTTP request latency",
        ["method", "route", "status"],
        registry=registry,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    )
    registry.register(StateCollector(factory, settings))
    app.state.registry = registry

    @app.middleware("http")
    async def _observe(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")
        latency.labels(request.method, template, str(response.status_code)).observe(
            time.perf_counter() - start
        )
        return response
