"""Benchmark: the control plane under concurrent clients, on loopback, against Postgres.

Starts the API twice as in production (``python -m maskops_api.server``: one uvicorn
process, migrations, the reconciler) on one fresh Postgres schema and a Redis queue prefix
of its own: once listening on loopback (auth off, as a single-host install runs) and once
on ``0.0.0.0``, as a deployment listens, where every request but ``/healthz``, ``/readyz``
and ``/metrics`` needs a bearer token (the run checks that a poll without one is refused).
Then measures in one run:

1. 1,000 job submissions (``POST /jobs``), every request sent twice at once under the same
   ``Idempotency-Key`` by ``--clients`` concurrent clients: exactly 1,000 jobs must exist
   afterwards, each pair answered with the same job (none lost, none doubled).
2. Status polls ``GET /jobs/{id}`` by ``--clients`` closed-loop clients (each sends its
   next request as soon as the answer arrives: far more than a real poller's load), each
   following one job of its own, the way a user or CI script follows the job it launched,
   while a writer process stands in for the workers and updates every followed job's
   progress every ``--update-interval`` seconds (ten times the production heartbeat
   rate), so polls also meet fresh changes. Three arms, alternated in ``--rounds`` rounds
   after a warm-up round (``bench/timing.py``: each arm once per round, in turn):
   - ``status_poll``: the loopback API, no token;
   - ``status_poll_token``: the ``0.0.0.0`` API, a valid bearer token (read scope, made
     as ``maskops token create`` makes one) on every poll; where its token checks were
     answered (memory or database) comes from its ``/metrics``;
   - ``healthz``: ``GET /healthz`` (no database) on the loopback API, a FastAPI route with
     nothing to do: the ratio poll p99 / healthz p99 shows what the job path costs over
     the bare framework (under 1: polls of jobs in memory are answered ahead of FastAPI's
     routing, see ``maskops_api/middleware/status_shortcut.py``).
   p50/p99 pooled over the rounds, and each round's p99 (median, min, max). Goal: p99 <
   25 ms with a token on every poll, and without.
3. Once, on the loopback API: ``status_poll_cold``, every poll a different job, none in the
   API's memory (the database read path alone), and listings ``GET /jobs?limit=50``.

Figures go to ``bench/results/bench_api.json``.

    .venv/bin/python bench/bench_api.py             # ~2 minutes
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
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from api_process import REPO, launch_api, wait_ready
from machine import RunConditions, start_run, write_results
from sqlalchemy import Engine, create_engine, make_url, text
from timing import alternate

from maskops_api.services.tokens import create_token
from maskops_core.db.migrate import upgrade_head
from maskops_core.db.models import TokenScope
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings

RESULTS = REPO / "bench" / "results" / "bench_api.json"
WARMUP_ROUNDS = 1
GOAL_P99_MS = 25
# Two API processes importing at once on a loaded 2-core machine took 50 s each.
STARTUP_TIMEOUT_S = 180.0
POLL_ARMS = ("healthz", "status_poll", "status_poll_token")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class KeepAliveConnection:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP for GETs.

    The load generator shares the two cores with the server; httpx spent more CPU per
    request than the API did, so the figure measured the client. This costs a few
    microseconds a request, which leaves the cores to the server.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: str
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.headers = headers

    @classmethod
    async def open(cls, host: str, port: int, token: str | None = None) -> KeepAliveConnection:
        """A connection whose every request carries ``token`` as its bearer token, if any."""
        reader, writer = await asyncio.open_connection(host, port)
        # The API serves only its own names (a browser's DNS-rebinding guard).
        headers = f"Host: {host}:{port}\r\n"
        headers += f"Authorization: Bearer {token}\r\n" if token else ""
        return cls(reader, writer, headers)

    async def get(self, path: str) -> int:
        """GET ``path``; the response status (the body is read and dropped)."""
        request = f"GET {path} HTTP/1.1\r\n{self.headers}\r\n"
        self.writer.write(request.encode())
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


@dataclass(frozen=True)
class Sample:
    """One stretch of requests: each one's latency, the non-200 statuses, the wall time."""

    latencies_ms: list[float]
    error_codes: Counter[int]
    seconds: float


def figures(samples: list[Sample]) -> dict[str, Any]:
    """Requests, errors, p50/p99 latency and requests/s over ``samples`` pooled."""
    latencies = [ms for sample in samples for ms in sample.latencies_ms]
    codes = sum((sample.error_codes for sample in samples), Counter[int]())
    return {
        "requests": len(latencies),
        "errors": sum(codes.values()),
        "error_codes": {str(k): v for k, v in sorted(codes.items())},
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "requests_per_s": round(len(latencies) / sum(s.seconds for s in samples), 1),
    }


async def hammer(
    host: str,
    port: int,
    paths: list[str],
    clients: int,
    total: int,
    *,
    follow: bool = False,
    token: str | None = None,
) -> Sample:
    """``total`` GETs from ``clients`` closed-loop clients (each waits for its answer before
    asking again), one keep-alive connection each, every request with ``token`` if given.
    With ``follow``, client ``k`` keeps asking for ``paths[k]``; otherwise clients take the
    next path in turn."""
    latencies: list[float] = []
    error_codes: Counter[int] = Counter()
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(paths[i % len(paths)])
    connections = [await KeepAliveConnection.open(host, port, token) for _ in range(clients)]

    async def client(k: int, connection: KeepAliveConnection) -> None:
        while not queue.empty():
            path = queue.get_nowait()
            if follow:
                path = paths[k % len(paths)]
            start = time.perf_counter()
            status = await connection.get(path)
            latencies.append((time.perf_counter() - start) * 1000)
            if status != 200:
                error_codes[status] += 1

    start = time.perf_counter()
    await asyncio.gather(*(client(k, c) for k, c in enumerate(connections)))
    elapsed = time.perf_counter() - start
    for connection in connections:
        await connection.close()
    return Sample(latencies, error_codes, elapsed)


def alternated(arms: dict[str, Callable[[], Sample]], rounds: int) -> dict[str, dict[str, Any]]:
    """Each arm once per round, in turn, after a warm-up round (bench/timing.py); an arm's
    figures pool its rounds, and ``p99_ms_by_round`` says how far one round moved."""
    kept: dict[str, list[Sample]] = {name: [] for name in arms}

    def measure(name: str, arm: Callable[[], Sample]) -> Callable[[], float]:
        def p99_of_one_round() -> float:
            sample = arm()
            kept[name].append(sample)
            return percentile(sample.latencies_ms, 0.99)

        return p99_of_one_round

    spreads = alternate([measure(n, a) for n, a in arms.items()], rounds, WARMUP_ROUNDS)
    return {
        name: {
            **figures(kept[name][WARMUP_ROUNDS:]),
            "p99_ms_by_round": spread.summary("ms", digits=2),
        }
        for name, spread in zip(arms, spreads, strict=True)
    }


def metric(base: str, name: str) -> dict[str, float]:
    """A counter of the API's ``/metrics`` by its ``source`` label."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith(f"{name}{{"):
            source = line.split('source="')[1].split('"')[0]
            found[source] = float(line.rsplit(" ", 1)[1])
    return found


def difference(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


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


def bench_settings(database_url: str, schema: str) -> Settings:
    return Settings(database_url=database_url, database_schema=schema, _env_file=None)  # type: ignore[call-arg]


def make_read_token(database_url: str, schema: str) -> str:
    """A read-scope API token in the bench schema, made as ``maskops token create`` makes
    one; its secret."""
    engine = make_engine(bench_settings(database_url, schema))
    try:
        with make_session_factory(engine)() as session:
            _, secret = create_token(session, name="bench", scope=TokenScope.read)
    finally:
        engine.dispose()
    return secret


def check_auth_required(base: str, job_id: int, token: str) -> None:
    """The production-mode API refuses a poll without a token and answers one with it."""
    without = httpx.get(f"{base}/jobs/{job_id}", timeout=10).status_code
    with_token = httpx.get(
        f"{base}/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).status_code
    if (without, with_token) != (401, 200):
        raise SystemExit(f"auth is not required as in production: {without}, {with_token}")


@contextmanager
def progress_writer(dsn: str, schema: str, job_ids: list[int], interval: float) -> Iterator[Any]:
    """The workers' stand-in running for the block; yields its count of updates."""
    stop, updates = multiprocessing.Event(), multiprocessing.Value("i", 0)
    writer = multiprocessing.Process(
        target=write_progress, args=(dsn, schema, job_ids, interval, stop, updates)
    )
    writer.start()
    try:
        yield updates
    finally:
        stop.set()
        writer.join()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--submissions", type=int, default=1000)
    # Per arm, over all rounds: a few seconds of polls (p99 over a one-second window
    # measured the host's hiccups).
    parser.add_argument("--polls", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--listings", type=int, default=2000)
    parser.add_argument("--update-interval", type=float, default=0.5)
    parser.add_argument(
        "--database-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--require-idle", action="store_true", help="refuse to run when loaded")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.submissions <= args.clients:
        parser.error("--submissions must exceed --clients (the cold polls ask for the rest)")
    return args


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def make_experiment(base: str, engine: Engine, schema: str) -> int:
    """A dataset (its shards marked converted) and an experiment to submit jobs for."""
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
    return int(experiment["id"])


async def submissions(base: str, experiment_id: int, args: argparse.Namespace) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        return await submit_all(client, experiment_id, args.submissions, args.clients)


def poll_rounds(
    args: argparse.Namespace, schema: str, loopback: str, production: str, followed: list[int],
    token: str,
) -> dict[str, Any]:  # fmt: skip
    """The three alternated arms while the writer updates the followed jobs."""
    per_round = max(1, args.polls // args.rounds)
    paths = [f"/jobs/{i}" for i in followed]

    def arm(
        base: str, paths: list[str], follow: bool, token: str | None = None
    ) -> Callable[[], Sample]:
        return lambda: asyncio.run(
            hammer("127.0.0.1", port_of(base), paths, args.clients, per_round, follow=follow,
                   token=token)
        )  # fmt: skip

    arms = {
        "healthz": arm(loopback, ["/healthz"], follow=False),
        "status_poll": arm(loopback, paths, follow=True),
        "status_poll_token": arm(production, paths, follow=True, token=token),
    }
    jobs, checks = "maskops_job_cache_reads_total", "maskops_token_checks_total"
    before = {base: metric(base, jobs) for base in (loopback, production)}
    checks_before = metric(production, checks)
    dsn = make_url(args.database_url).set(drivername="postgresql").render_as_string(False)
    with progress_writer(dsn, schema, followed, args.update_interval) as updates:
        polls: dict[str, Any] = dict(alternated(arms, args.rounds))
    polls["job_updates_during_polls"] = updates.value
    for name, base in (("status_poll", loopback), ("status_poll_token", production)):
        polls[name]["served_from"] = difference(metric(base, jobs), before[base])
    polls["status_poll_token"]["token_checks"] = difference(metric(production, checks),
                                                            checks_before)  # fmt: skip
    return polls


def measure(
    args: argparse.Namespace, engine: Engine, schema: str, loopback: str, production: str
) -> dict[str, Any]:
    experiment_id = make_experiment(loopback, engine, schema)
    submitted = asyncio.run(submissions(loopback, experiment_id, args))
    ids = list(submitted.pop("job_ids"))
    random.Random(0).shuffle(ids)
    token = make_read_token(args.database_url, schema)
    followed, rest = ids[: args.clients], ids[args.clients :]
    check_auth_required(production, followed[0], token)
    results: dict[str, Any] = {"submissions": submitted}
    results.update(poll_rounds(args, schema, loopback, production, followed, token))
    port = port_of(loopback)
    cold = asyncio.run(hammer("127.0.0.1", port, [f"/jobs/{i}" for i in rest], args.clients,
                              len(rest)))  # fmt: skip
    listing = asyncio.run(hammer(
        "127.0.0.1", port, ["/jobs?limit=50", "/jobs?status=queued&action=train&limit=50"],
        args.clients, args.listings,
    ))  # fmt: skip
    results.update(status_poll_cold=figures([cold]), list_jobs=figures([listing]))
    with engine.connect() as conn:
        results["submissions"]["jobs_in_database"] = conn.execute(
            text(f"SELECT count(*) FROM \"{schema}\".jobs WHERE action = 'train'")
        ).scalar_one()
    return results


def main() -> int:
    args = parse_args()
    conditions = start_run(require_idle=args.require_idle)
    tag = uuid.uuid4().hex[:8]
    schema = f"maskops_bench_{tag}"
    prefix = f"maskops-bench-{tag}-"
    data_root = Path(f"/tmp/maskops-bench-{tag}")
    env = api_env(args, schema, prefix, data_root)
    engine = create_engine(args.database_url)
    servers: list[subprocess.Popen[bytes]] = []
    try:
        # Migrated once here, so that the two servers can start side by side.
        upgrade_head(bench_settings(args.database_url, schema))
        bases = []
        for host in ("127.0.0.1", "0.0.0.0"):
            server, base = launch_api(env, host=host)
            servers.append(server)
            bases.append(base)
        for server, base in zip(servers, bases, strict=True):
            wait_ready(server, base, timeout_s=STARTUP_TIMEOUT_S)
        loopback, production = bases
        results = measure(args, engine, schema, loopback, production)
    finally:
        for server in servers:
            server.terminate()
            server.wait(30)
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()
        broker = redis.Redis.from_url(args.redis_url)
        broker.delete(f"{prefix}gpu", f"{prefix}cpu")
        broker.close()
        subprocess.run(["rm", "-rf", str(data_root)], check=False)
    return report(args, results, conditions)


def api_env(args: argparse.Namespace, schema: str, prefix: str, data_root: Path) -> dict[str, str]:
    """The servers' settings: the bench's own schema, queues and (empty) dataset files."""
    for split in ("train", "val"):
        (data_root / "d" / split).mkdir(parents=True)
        (data_root / "d" / f"{split}.json").write_text("{}")
    return {
        "MASKOPS_DATABASE_URL": args.database_url,
        "MASKOPS_DATABASE_SCHEMA": schema,
        "MASKOPS_BROKER_URL": args.redis_url,
        "MASKOPS_QUEUE_PREFIX": prefix,
        "MASKOPS_DATA_ROOT": str(data_root),
        "MASKOPS_REDISPATCH_AFTER_S": "3600",
        "MASKOPS_AUTH": "auto",  # required exactly where the server listens beyond loopback
    }


def report(args: argparse.Namespace, results: dict[str, Any], conditions: RunConditions) -> int:
    s = results["submissions"]
    ok = s["jobs_in_database"] == args.submissions == s["distinct_job_ids"]
    ok = ok and s["pairs_answered_differently"] == 0 and s["failed_pairs"] == 0
    poll, token_poll = results["status_poll"]["p99_ms"], results["status_poll_token"]["p99_ms"]
    results.update(
        clients=args.clients,
        rounds=args.rounds,
        update_interval_s=args.update_interval,
        idempotency_exact=ok,
        poll_p99_over_healthz_p99=round(poll / max(results["healthz"]["p99_ms"], 1e-9), 2),
        token_poll_p99_over_poll_p99=round(token_poll / max(poll, 1e-9), 2),
        goal_poll_p99_ms=GOAL_P99_MS,
        goal_met=max(poll, token_poll) < GOAL_P99_MS,
    )
    write_results(args.out, results, conditions)
    print(f"submissions: {s['submissions']} x2 in {s['seconds']} s -> "
          f"{s['jobs_in_database']} jobs (exact: {ok})")  # fmt: skip
    for name in (*POLL_ARMS, "status_poll_cold", "list_jobs"):
        r = results[name]
        print(f"{name:17s} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
              f"{r['requests_per_s']:8.1f} req/s  errors {r['errors']}")  # fmt: skip
    print(f"token checks: {results['status_poll_token']['token_checks']}")
    errors = sum(results[name]["errors"] for name in POLL_ARMS)
    return 0 if ok and errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
