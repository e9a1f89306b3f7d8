"""Benchmark: the control plane under concurrent clients, on loopback, against Postgres.

Starts the API as in production (``python -m maskops_api.server``: one uvicorn process,
migrations, the reconciler) on a fresh Postgres schema and a Redis queue prefix of its
own, then measures in one run:

1. 1,000 job submissions (``POST /jobs``), every request sent twice at once under the same
   ``Idempotency-Key`` by ``--clients`` concurrent clients: exactly 1,000 jobs must exist
   afterwards, each pair answered with the same job (none lost, none doubled).
2. Status polls ``GET /jobs/{id}`` by ``--clients`` closed-loop clients (each sends its
   next request as soon as the answer arrives: far more than a real poller's load):
   - ``status_poll``: each client follows one job of its own, the way a user or CI script
     follows the job it launched, while a writer thread stands in for the workers and
     updates every followed job's progress every ``--update-interval`` seconds (ten times
     the production heartbeat rate), so polls also meet fresh changes. Goal: p99 < 25 ms.
   - ``status_poll_cold``: every poll asks for a different job, none in the API's memory:
     the database read path alone.
   and listings ``GET /jobs?limit=50``. p50/p99 latency and requests/s for each.
3. Baseline, same clients and server: ``GET /healthz`` (no database), a FastAPI route
   with nothing to do. The ratio poll p99 / healthz p99 shows what the job path costs
   over the bare framework (under 1: polls of jobs in memory are answered ahead of
   FastAPI's routing, see ``maskops_api/status_shortcut.py``).

Figures go to ``bench/results/bench_api.json``.

    .venv/bin/python bench/bench_api.py             # ~1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import statistics
import subprocess
import sys
import time
import uuid
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from api_process import REPO, start_api
from machine import start_run, write_results
from sqlalchemy import create_engine, make_url, text

RESULTS = REPO / "bench" / "results" / "bench_api.json"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class KeepAliveConnection:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP for GETs.

    The load generator shares the two cores with the server; httpx spent more CPU per
    request than the API did, so the figure measured the client. This costs a few
    microseconds a request, which leaves the cores to the server.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> KeepAliveConnection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def get(self, path: str) -> int:
        """GET ``path``; the response status (the body is read and dropped)."""
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        lowered = head.lower()
        at = lowered.find(b"content-length:")
        if at < 0:
            raise RuntimeError(f"response without content-length: {head[:200]!r}")
        length = int(lowered[at + 15 : lowered.index(b"\r\n", at)])
        await self.reader.readexactly(length)
        return int(head[9:12])

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def hammer(
    host: str, port: int, paths: list[str], clients: int, total: int, *, follow: bool = False
) -> dict[str, Any]:
    """``total`` GETs from ``clients`` closed-loop clients (each waits for its answer before
    asking again), one keep-alive connection each; latency in ms. With ``follow``, client
    ``k`` keeps asking for ``paths[k]``; otherwise clients take the next path in turn."""
    latencies: list[float] = []
    error_codes: dict[int, int] = {}
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(paths[i % len(paths)])
    connections = [await KeepAliveConnection.open(host, port) for _ in range(clients)]

    async def client(k: int, connection: KeepAliveConnection) -> None:
        while not queue.empty():
            path = queue.get_nowait()
            if follow:
                path = paths[k % len(paths)]
            start = time.perf_counter()
            status = await connection.get(path)
            latencies.append((time.perf_counter() - start) * 1000)
            if status != 200:
                error_codes[status] = error_codes.get(status, 0) + 1

    start = time.perf_counter()
    await asyncio.gather(*(client(k, c) for k, c in enumerate(connections)))
    elapsed = time.perf_counter() - start
    for connection in connections:
        await connection.close()
    return {
        "requests": total,
        "errors": sum(error_codes.values()),
        "error_codes": {str(k): v for k, v in error_codes.items()},
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "requests_per_s": round(total / elapsed, 1),
    }


def cache_reads(base: str) -> dict[str, float]:
    """The API's job-cache counters from ``/metrics`` (memory vs database reads)."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("maskops_job_cache_reads_total{"):
            source = line.split('source="')[1].split('"')[0]
            found[source] = float(line.rsplit(" ", 1)[1])
    return found


def write_progress(
    dsn: str, schema: str, job_ids: list[int], interval: float, stop: Event, updates: Any
) -> None:
    """Stands in for the workers, in a process of its own as they are: bumps each job's
    progress every ``interval`` seconds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Running with a progress baseline, as a worker leaves them: each answer carries
        # an ETA, which depends on the time of the poll.
        conn.execute(
            f"UPDATE \"{schema}\".jobs SET status = 'running', started_at = now(), "
            "progress_started_at = now(), progress_started_step = 0 WHERE id = ANY(%s)",
            (job_ids,),
        )
        step = 0
        while not stop.wait(interval / len(job_ids)):
            step += 1
            conn.execute(
                f'UPDATE "{schema}".jobs SET progress_step = %s, progress_total = 1000, '
                "heartbeat_at = now() WHERE id = %s",
                (step, job_ids[step % len(job_ids)]),
            )
            updates.value = step


async def submit_all(
    client: httpx.AsyncClient, experiment_id: int, count: int, clients: int
) -> dict[str, Any]:
    semaphore = asyncio.Semaphore(clients)
    mismatches = 0
    failures = 0
    transport_retries = 0
    ids: set[int] = set()

    async def post(body: dict[str, Any], key: str) -> httpx.Response:
        # A client that lost its connection retries with the same key: that is what the
        # key is for.
        nonlocal transport_retries
        for attempt in range(5):
            try:
                return await client.post("/jobs", json=body, headers={"Idempotency-Key": key})
            except httpx.TransportError:
                transport_retries += 1
                await asyncio.sleep(0.1 * (attempt + 1))
        return await client.post("/jobs", json=body, headers={"Idempotency-Key": key})

    async def submit(i: int) -> None:
        nonlocal mismatches, failures
        key = f"bench-{i}"
        body = {"action": "train", "experiment_id": experiment_id}
        async with semaphore:
            # The request and its retry race each other on purpose.
            first, retry = await asyncio.gather(post(body, key), post(body, key))
        if first.status_code != 202 or retry.status_code != 202:
            failures += 1
            return
        mismatches += first.json()["id"] != retry.json()["id"]
        ids.add(first.json()["id"])

    start = time.perf_counter()
    await asyncio.gather(*(submit(i) for i in range(count)))
    return {
        "submissions": count,
        "requests": 2 * count,
        "seconds": round(time.perf_counter() - start, 2),
        "failed_pairs": failures,
        "pairs_answered_differently": mismatches,
        "distinct_job_ids": len(ids),
        "transport_retries": transport_retries,
        "job_ids": sorted(ids),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--submissions", type=int, default=1000)
    # A few seconds of polls: p99 over a one-second window measured the host's hiccups.
    parser.add_argument("--polls", type=int, default=50000)
    parser.add_argument("--listings", type=int, default=2000)
    parser.add_argument("--update-interval", type=float, default=0.5)
    parser.add_argument(
        "--database-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--require-idle", action="store_true", help="refuse to run when loaded")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    conditions = start_run(require_idle=args.require_idle)

    tag = uuid.uuid4().hex[:8]
    schema = f"maskops_bench_{tag}"
    prefix = f"maskops-bench-{tag}-"
    data_root = Path(f"/tmp/maskops-bench-{tag}")
    for split in ("train", "val"):
        (data_root / "d" / split).mkdir(parents=True)
        (data_root / "d" / f"{split}.json").write_text("{}")
    server, base = start_api(
        {
            "MASKOPS_DATABASE_URL": args.database_url,
            "MASKOPS_DATABASE_SCHEMA": schema,
            "MASKOPS_BROKER_URL": args.redis_url,
            "MASKOPS_QUEUE_PREFIX": prefix,
            "MASKOPS_DATA_ROOT": str(data_root),
            "MASKOPS_REDISPATCH_AFTER_S": "3600",
        }
    )
    port = int(base.rsplit(":", 1)[1])
    engine = create_engine(args.database_url)
    dsn = make_url(args.database_url).set(drivername="postgresql").render_as_string(False)
    try:
        with httpx.Client(base_url=base, timeout=30) as c:
            dataset = c.post(
                "/datasets",
                json={
                    "name": "bench",
                    "train": {"image_dir": "d/train", "annotation_file": "d/train.json"},
                },
            ).json()
            with engine.begin() as conn:
                conn.execute(
                    text(f'UPDATE "{schema}".datasets SET shards_dir = :d WHERE id = :i'),
                    {"d": "d", "i": dataset["id"]},
                )
            experiment = c.post(
                "/experiments",
                json={"name": "bench", "dataset_id": dataset["id"], "spec": {"total_steps": 1}},
            ).json()

        async def run() -> dict[str, Any]:
            limits = httpx.Limits(
                max_connections=args.clients, max_keepalive_connections=args.clients
            )
            async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
                submissions = await submit_all(
                    client, experiment["id"], args.submissions, args.clients
                )
                ids = list(submissions.pop("job_ids"))
                random.Random(0).shuffle(ids)
            host, clients = "127.0.0.1", args.clients
            await hammer(host, port, ["/healthz"], clients, 500)  # warm-up
            baseline = await hammer(host, port, ["/healthz"], clients, args.polls)
            followed = ids[:clients]
            stop, updates = multiprocessing.Event(), multiprocessing.Value("i", 0)
            writer = multiprocessing.Process(
                target=write_progress,
                args=(dsn, schema, followed, args.update_interval, stop, updates),
            )
            writer.start()
            polls = await hammer(
                host, port, [f"/jobs/{i}" for i in followed], clients, args.polls, follow=True
            )
            stop.set()
            writer.join()
            polls["job_updates_during_run"] = updates.value
            polls["served_from"] = cache_reads(base)
            cold = await hammer(host, port, [f"/jobs/{i}" for i in ids[clients:]], clients,
                                len(ids) - clients)  # fmt: skip
            listing = await hammer(
                host, port, ["/jobs?limit=50", "/jobs?status=queued&action=train&limit=50"],
                clients, args.listings,
            )  # fmt: skip
            return {"submissions": submissions, "healthz": baseline, "status_poll": polls,
                    "status_poll_cold": cold, "list_jobs": listing}  # fmt: skip

        results = asyncio.run(run())
        with engine.connect() as conn:
            jobs = conn.execute(
                text(f"SELECT count(*) FROM \"{schema}\".jobs WHERE action = 'train'")
            ).scalar_one()
        results["submissions"]["jobs_in_database"] = jobs
    finally:
        server.terminate()
        server.wait(30)
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()
        broker = redis.Redis.from_url(args.redis_url)
        broker.delete(f"{prefix}gpu", f"{prefix}cpu")
        broker.close()
        subprocess.run(["rm", "-rf", str(data_root)], check=False)

    s = results["submissions"]
    ok = s["jobs_in_database"] == args.submissions == s["distinct_job_ids"]
    ok = ok and s["pairs_answered_differently"] == 0 and s["failed_pairs"] == 0
    ratio = results["status_poll"]["p99_ms"] / max(results["healthz"]["p99_ms"], 1e-9)
    results.update(
        clients=args.clients,
        update_interval_s=args.update_interval,
        idempotency_exact=ok,
        poll_p99_over_healthz_p99=round(ratio, 2),
        goal_poll_p99_ms=25,
        goal_met=results["status_poll"]["p99_ms"] < 25,
    )
    write_results(args.out, results, conditions)
    print(f"submissions: {s['submissions']} x2 in {s['seconds']} s -> "
          f"{s['jobs_in_database']} jobs (exact: {ok})")  # fmt: skip
    for name in ("healthz", "status_poll", "status_poll_cold", "list_jobs"):
        r = results[name]
        print(f"{name:12s} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
              f"{r['requests_per_s']:8.1f} req/s  errors {r['errors']}")  # fmt: skip
    print(f"ratio status-poll p99 / healthz p99 (baseline): {ratio:.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
