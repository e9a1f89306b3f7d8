"""Benchmark: the control plane under concurrent clients, on loopback, against Postgres.

Starts the API as in production (``python -m maskops_api.server``: one uvicorn process,
migrations, the reconciler) on a fresh Postgres schema and a Redis queue prefix of its
own, then measures in one run:

1. 1,000 job submissions (``POST /jobs``), every request sent twice at once under the same
   ``Idempotency-Key`` by ``--clients`` concurrent clients: exactly 1,000 jobs must exist
   afterwards, each pair answered with the same job (none lost, none doubled).
2. Status polls ``GET /jobs/{id}`` and listings ``GET /jobs?limit=50`` under ``--clients``
   concurrent clients: p50/p99 latency and requests/s. Goal: p99 < 25 ms for status polls.
3. Baseline, same clients and server: ``GET /healthz`` (no database). The ratio
   poll p99 / healthz p99 shows what the database path costs.

Figures go to ``bench/results/bench_api.json``.

    .venv/bin/python bench/bench_api.py             # ~1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "bench_api.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def hammer(
    client: httpx.AsyncClient, paths: list[str], clients: int, total: int
) -> dict[str, Any]:
    """``total`` GETs spread over ``clients`` concurrent workers; latency in ms."""
    latencies: list[float] = []
    errors = 0
    error_codes: dict[int, int] = {}
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(paths[i % len(paths)])

    async def worker() -> None:
        nonlocal errors
        while not queue.empty():
            path = queue.get_nowait()
            start = time.perf_counter()
            try:
                response = await client.get(path)
            except httpx.TransportError:
                errors += 1
                error_codes[0] = error_codes.get(0, 0) + 1
                continue
            latencies.append((time.perf_counter() - start) * 1000)
            if response.status_code != 200:
                errors += 1
                error_codes[response.status_code] = error_codes.get(response.status_code, 0) + 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    return {
        "requests": total,
        "errors": errors,
        "error_codes": {str(k): v for k, v in error_codes.items()},
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "requests_per_s": round(total / elapsed, 1),
    }


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
        body = {"action": "train", "experiment_id": experiment_id, "options": {"n": i}}
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
    parser.add_argument("--polls", type=int, default=5000)
    parser.add_argument(
        "--database-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    args = parser.parse_args()

    tag = uuid.uuid4().hex[:8]
    schema = f"maskops_bench_{tag}"
    prefix = f"maskops-bench-{tag}-"
    data_root = Path(f"/tmp/maskops-bench-{tag}")
    for split in ("train", "val"):
        (data_root / "d" / split).mkdir(parents=True)
        (data_root / "d" / f"{split}.json").write_text("{}")
    port = free_port()
    env = {
        **os.environ,
        "MASKOPS_DATABASE_URL": args.database_url,
        "MASKOPS_DATABASE_SCHEMA": schema,
        "MASKOPS_BROKER_URL": args.redis_url,
        "MASKOPS_QUEUE_PREFIX": prefix,
        "MASKOPS_DATA_ROOT": str(data_root),
        "MASKOPS_HOST": "127.0.0.1",
        "MASKOPS_PORT": str(port),
        "MASKOPS_REDISPATCH_AFTER_S": "3600",
    }
    server = subprocess.Popen([sys.executable, "-m", "maskops_api.server"], env=env, cwd=REPO)
    engine = create_engine(args.database_url)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
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
                await hammer(client, ["/healthz"], args.clients, 500)  # warm-up
                baseline = await hammer(client, ["/healthz"], args.clients, args.polls)
                polls = await hammer(client, [f"/jobs/{i}" for i in ids], args.clients, args.polls)
                listing = await hammer(
                    client, ["/jobs?limit=50", "/jobs?status=queued&action=train&limit=50"],
                    args.clients, args.polls // 5,
                )  # fmt: skip
                return {"submissions": submissions, "healthz": baseline, "status_poll": polls,
                        "list_jobs": listing}  # fmt: skip

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
        cpu_count=os.cpu_count(),
        idempotency_exact=ok,
        poll_p99_over_healthz_p99=round(ratio, 2),
        goal_poll_p99_ms=25,
        goal_met=results["status_poll"]["p99_ms"] < 25,
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"submissions: {s['submissions']} x2 in {s['seconds']} s -> "
          f"{s['jobs_in_database']} jobs (exact: {ok})")  # fmt: skip
    for name in ("healthz", "status_poll", "list_jobs"):
        r = results[name]
        print(f"{name:12s} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
              f"{r['requests_per_s']:8.1f} req/s  errors {r['errors']}")  # fmt: skip
    print(f"ratio status-poll p99 / healthz p99 (baseline): {ratio:.2f}x")
    print(f"wrote {RESULTS}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
