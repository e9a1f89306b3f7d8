"""Prometheus metrics: request latency per route, jobs by state and queue depth at scrape."""

from __future__ import annotations

import time
from collections.abc import Iterator

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from maskops_api.cache.job_cache import JobCache
from maskops_api.cache.token_cache import TokenCache
from maskops_core.db.models import Job
from maskops_core.settings import Settings


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
                    key = self.settings.broker_key_prefix + queue
                    depth.add_metric([queue], client.llen(key))
                client.close()
            except Exception:
                pass
        yield depth


class LatencyMiddleware:
    """Pure ASGI middleware timing each HTTP request by route template and status.

    Starlette's ``BaseHTTPMiddleware`` (``@app.middleware``) runs the app in a separate
    task and re-streams the body; under 50 polling clients that alone halved throughput.
    """

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            self.histogram.labels(scope["method"], template, str(status)).observe(
                time.perf_counter() - start
            )


class JobCacheCollector(Collector):
    def __init__(self, cache: JobCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        reads = CounterMetricFamily(
            "maskops_job_cache_reads", "Job status reads by where they were served from",
            labels=["source"],
        )  # fmt: skip
        reads.add_metric(["memory"], self.cache.hits)
        reads.add_metric(["database"], self.cache.misses)
        yield reads
        yield GaugeMetricFamily(
            "maskops_job_cache_live", "1 while Postgres notifications keep the cache fresh",
            value=int(self.cache.live),
        )  # fmt: skip


class TokenCacheCollector(Collector):
    def __init__(self, cache: TokenCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[CounterMetricFamily]:
        checks = CounterMetricFamily(
            "maskops_token_checks", "Bearer token checks by where the token was found",
            labels=["source"],
        )  # fmt: skip
        checks.add_metric(["memory"], self.cache.hits)
        checks.add_metric(["database"], self.cache.misses)
        yield checks


def install_metrics(
    app: FastAPI,
    factory: sessionmaker[Session],
    settings: Settings,
    job_cache: JobCache,
    token_cache: TokenCache,
) -> None:
    registry = CollectorRegistry()
    latency = Histogram(
        "maskops_http_request_seconds",
        "HTTP request latency",
        ["method", "route", "status"],
        registry=registry,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    )
    registry.register(StateCollector(factory, settings))
    registry.register(JobCacheCollector(job_cache))
    registry.register(TokenCacheCollector(token_cache))
    app.state.registry = registry
    app.add_middleware(LatencyMiddleware, histogram=latency)
