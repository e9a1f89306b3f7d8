"""The API's view of the Triton replicas: one :class:`~maskops.serving.replicas.ReplicaPool`
per app (``/infer`` spreads requests over it), and each replica's state for ``/readyz`` and
``GET /models/{name}`` (docs/operations.md#several-triton-replicas)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from starlette.datastructures import State

from maskops_core.settings import Settings

if TYPE_CHECKING:
    from maskops.serving.replicas import ReplicaPool

_creating = threading.Lock()


def replica_pool(state: State) -> ReplicaPool:
    """The app's pool, made on first use (tritonclient is imported only then)."""
    with _creating:
        pool: ReplicaPool | None = getattr(state, "triton_pool", None)
        if pool is None:
            from maskops.serving.replicas import ReplicaPool

            settings: Settings = state.settings
            pool = ReplicaPool(settings.triton_replicas, refresh_s=settings.triton_dns_refresh_s)
            state.triton_pool = pool
        return pool


def probe(url: str, models: Sequence[str] = ()) -> str:
    """``ok``, or why the replica at ``url`` cannot serve: Triton's health endpoint, then
    each published model's (one unloaded behind the control plane's back is named)."""
    import httpx

    base = url if url.startswith("http") else f"http://{url}"
    try:
        with httpx.Client(base_url=base, timeout=2) as client:
            status = client.get("/v2/health/ready").status_code
            # A server with strict readiness is not ready while a model it knows is not.
            missing = [m for m in models if client.get(f"/v2/models/{m}/ready").status_code != 200]
    except httpx.HTTPError as exc:
        return f"unreachable: {type(exc).__name__}"
    if missing:
        return f"published but not loaded: {', '.join(missing)}"
    return "ok" if status == 200 else f"not ready ({status})"


@dataclass
class Readiness:
    """``summary`` is ``/readyz``'s ``triton`` check; ``replicas`` each replica's probe."""

    summary: str
    replicas: dict[str, str] = field(default_factory=dict)

    @property
    def serving(self) -> bool:
        """At least one replica can answer ``/infer``."""
        return any(state == "ok" for state in self.replicas.values())


def readiness(state: State, models: Sequence[str] = ()) -> Readiness:
    """Probe every replica at once for the published ``models``. One replica down of
    several leaves the API serving (``/infer`` goes to the others), so the summary counts
    them."""
    from maskops.serving.client import TritonUnavailable

    try:
        urls = replica_pool(state).replicas()
    except TritonUnavailable as exc:
        return Readiness(str(exc))
    if not urls:
        return Readiness("no Triton replica (MASKOPS_TRITON_DNS resolves to none)")
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        states = dict(zip(urls, pool.map(partial(probe, models=models), urls), strict=True))
    ready = sum(s == "ok" for s in states.values())
    if ready == len(urls):
        return Readiness("ok", states)
    if len(urls) == 1:
        return Readiness(states[urls[0]], states)
    down = "; ".join(f"{url} {s}" for url, s in states.items() if s != "ok")
    return Readiness(f"{ready} of {len(urls)} replicas ready ({down})", states)
