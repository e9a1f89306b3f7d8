"""What serving adds around the network: the served ensemble's protocol against its former one.

One checkpoint (random weights, ``--nlayers``, ``--image-size``; the GPU check's serving
size by default) is published on the torch network backend on this CPU twice, under two
names, served by one real Triton server:

- ``current``: what publish writes: the preprocess model hands the network uint8 pixels,
  which it divides by 255 itself, and the preprocess and postprocess models batch without
  a queue delay;
- ``former``: the same repository with the configs as publish wrote them before: float32
  pixels (four times the bytes to hand over between the models' processes) and a 2 ms
  queue delay on the preprocess and postprocess models too.

One client sends the demo data's 256x256 JPEGs one at a time, ``--requests`` per arm and
round, arms alternated over ``--rounds`` rounds (bench/timing.py). Each request's time outside
the network's own execution is the client's latency less the network's ``compute_infer``
(Triton's statistics, bench/gpu_serving.py's ``time_in_server``): decoding, resizing,
handing tensors between the models' processes, queueing, pasting, JSON and HTTP. That
overhead is the figure; the network's seconds on a CPU would drown it in the latency.
Reported: each arm's overhead per request (median over rounds and range), where it goes
by part, and the former over the current (above 1: the current protocol adds less).

    .venv/bin/python bench/bench_served_overhead.py [--rounds 3] [--requests 4]
        [--nlayers 10] [--image-size 832 1344] [--out FILE]
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_serving_steps import demo_images
from gpu_serving import (
    NAME,
    HttpClient,
    publish_torch,
    random_checkpoint,
    settled_statistics,
    time_in_server,
)
from machine import RunConditions, start_run, write_results
from timing import alternate

RESULTS = Path(__file__).resolve().parent / "results" / "bench_served_overhead.json"
ARMS = ("current", "former")
FORMER_DELAY_US = 2000


def as_formerly_published(repository: Path, name: str) -> None:
    """Rewrite model ``name``'s configs as publish wrote them before: float32 pixels from
    the preprocess model to the network, and the processing models' 2 ms queue delay."""
    from maskops.serving.protocol import NET_INPUT, EnsembleNames

    names = EnsembleNames(name)
    image = re.compile(rf'(name: "{NET_INPUT}" data_type: )TYPE_UINT8')
    for model in (names.preprocess, names.net, names.postprocess):
        path = repository / model / "config.pbtxt"
        text, images = image.subn(r"\1TYPE_FP32", path.read_text())
        delay = "max_queue_delay_microseconds: "
        if model != names.net:
            text, delays = re.subn(rf"{delay}0\b", f"{delay}{FORMER_DELAY_US}", text)
            if delays != 1:
                raise RuntimeError(f"{path}: no queue delay of 0 to rewrite")
        if images != (model != names.postprocess):
            raise RuntimeError(f"{path}: no uint8 {NET_INPUT} to rewrite")
        path.write_text(text)


class Arm:
    """One served model, its client, and what its requests cost."""

    def __init__(self, url: str, name: str, images: list[bytes]) -> None:
        self.url, self.name, self.images = url, name, images
        self.client = HttpClient(url, name)
        self.parts: list[dict[str, dict[str, float]]] = []

    def overhead_ms(self, requests: int) -> float:
        """Send ``requests`` images one at a time; their mean ms outside the network."""
        before = settled_statistics(self.url, self.name)
        started = time.perf_counter()
        for index in range(requests):
            self.client.infer(self.images[index % len(self.images)])
        latency_ms = (time.perf_counter() - started) * 1000 / requests
        after = settled_statistics(self.url, self.name, since=before, requests=requests)
        parts = time_in_server(before, after, self.name)
        self.parts.append(parts)
        return latency_ms - parts["net"]["compute_infer_ms"]


def median_parts(parts: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each part's figures, the median over the rounds."""
    return {
        part: {
            key: round(statistics.median(p[part][key] for p in parts), 3) for key in parts[0][part]
        }
        for part in parts[0]
    }


def measure(args: argparse.Namespace, work: Path, conditions: RunConditions) -> dict[str, Any]:
    from maskops.serving.launcher import TritonServer
    from maskops.serving.protocol import EnsembleNames

    size = (args.image_size[0], args.image_size[1])
    checkpoint = random_checkpoint(work / "model.pth", size=size, nlayers=args.nlayers)
    images = demo_images(work, 8)
    repository = work / "repository"
    names = {arm: f"{NAME}_{arm}" for arm in ARMS}
    for name in names.values():
        publish_torch(checkpoint, repository, name, "fp32", cuda=False)
    as_formerly_published(repository, names["former"])
    with TritonServer(
        repository,
        models=[model for name in names.values() for model in EnsembleNames(name).load_order],
        log_file=work / "tritonserver.log",
        startup_timeout_s=300,
    ) as server:
        arms = {arm: Arm(server.http_url, name, images) for arm, name in names.items()}
        spreads = alternate(
            [lambda arm=arm: arms[arm].overhead_ms(args.requests) for arm in ARMS],
            rounds=args.rounds,
        )
        # The run ends while its server runs: the server's workers' time is the run's own.
        conditions.end_now()
    overhead = dict(zip(ARMS, spreads, strict=True))
    rounds = args.rounds
    return {
        "config": {**vars(args), "image_size": list(size), "device": "cpu", "precision": "fp32"},
        "overhead_ms": {arm: overhead[arm].summary("ms", digits=2) for arm in ARMS},
        "parts": {arm: median_parts(arms[arm].parts[-rounds:]) for arm in ARMS},
        "former_over_current": round(overhead["former"].median / overhead["current"].median, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4, help="per arm and round")
    parser.add_argument("--nlayers", type=int, default=10)
    parser.add_argument("--image-size", type=int, nargs=2, default=[832, 1344])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    conditions = start_run()
    out = args.out
    del args.out
    with tempfile.TemporaryDirectory() as work:
        figures = measure(args, Path(work), conditions)
    for arm in ARMS:
        print(f"{arm}: {figures['overhead_ms'][arm]['median_ms']} ms a request outside the network")
    print(f"former / current: {figures['former_over_current']}")
    write_results(out, figures, conditions)


if __name__ == "__main__":
    main()
