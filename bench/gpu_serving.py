"""The torch network backend served by the real Triton, against in-process inference.

gpu_check's ``serving_torch`` step (bench/gpu_check_steps.py) runs :func:`serving_check` on
the check's trained checkpoint; it also runs on its own::

    python bench/gpu_serving.py --checkpoint CKPT --images DIR --device cuda --out FILE

What it does, in the GPU host's environment (no API, no Celery, no database): publish's
repository writer puts the checkpoint in a model repository with ``net_backend="torch"``
on the device (``precision`` ``auto`` resolved here, so the config records bf16 or fp16);
the launcher ``maskops serve`` uses starts the tritonserver of the nvidia-pytriton wheel
on it; images go over HTTP through the ensemble (maskops.serving.client, what
``POST /infer`` calls); the answers are compared with in-process inference of the same
checkpoint on the same device and precision (the same :class:`TorchNetwork` forward,
the engine's torch pre- and post-processing) within the export's parity tolerances
(fp32's, fp16's for autocast; under autocast an fp32 twin of the model is served beside
it, and its comparison decides). Then, in the same run: images/s served with 1 and 8
concurrent clients, p50/p99 latency of one client at batch 1, and in-process eager
images/s at batch 1 and 8 and its batch-1 latency, each end to end (encoded bytes in,
COCO results out); tuning arms: the served rate with two instances of each composing
model, with four of the preprocess and postprocess models, and on CUDA with the network's
outputs copied to host memory in the network model (:data:`SERVED_ARMS`), and eager
batch-8 runs with ``channels_last``, with the backbone compiled, and with it compiled to
CUDA graphs (:data:`EAGER_ARMS`).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NAME = "check"
EXACT_NAME = "check_fp32"
SCORE_THRESHOLD = 0.05


def random_checkpoint(
    path: Path, *, size: tuple[int, int], nlayers: int, heads: Mapping[str, Any] | None = None
) -> Path:
    """A checkpoint of random weights (seed 0) for ``size`` images and ResNet ``nlayers``
    with three classes: what the throughput figures measure when no trained one fits
    (R50-FPN 832x1344, as the inference throughput step; up to 100 detections an image).
    ``heads``: ``maskrcnn_config`` overrides (TAO's heads by default)."""
    import torch

    from maskops.checkpoints.model_file import save_checkpoint
    from maskops.data.labels import LabelMap
    from maskops.modeling import build_model
    from maskops.spec.models import ExperimentSpec

    spec = ExperimentSpec.model_validate(
        {
            "data_config": {"image_size": size, "num_classes": 4},
            "maskrcnn_config": {"nlayers": nlayers, **(heads or {})},
        }
    )
    torch.manual_seed(0)
    model = build_model(spec.maskrcnn_config, num_classes=4, image_size=size)
    names = [{"id": i, "name": n} for i, n in enumerate(("circle", "square", "triangle"), 1)]
    label_map = LabelMap.from_coco_categories(names)
    return save_checkpoint(path, model=model, spec=spec, label_map=label_map, step=0)


def network_config(url: str) -> dict[str, str]:
    """The network config's record of where and how it runs (protocol.NET_PARAMETERS)."""
    import urllib.request

    from maskops.serving.protocol import NET_PARAMETERS, EnsembleNames

    net = EnsembleNames(NAME).net
    with urllib.request.urlopen(f"http://{url}/v2/models/{net}/config", timeout=30) as answer:
        parameters = json.loads(answer.read()).get("parameters", {})
    return {ours: parameters[key]["string_value"] for key, ours in NET_PARAMETERS.items()}


def in_process(network: Any, images: Sequence[bytes]) -> list[list[dict[str, Any]]]:
    """COCO results of the eager network on ``images``, all of them as one batch, the
    pixels carried to its device as uint8, as the served preprocess model hands them over."""
    import torch

    from maskops.serving.processing import coco_results, preprocess_image, unpad_detections

    size = network.info.image_size
    prepared = [preprocess_image(data, size, keep_uint8=True) for data in images]
    batch = torch.stack([torch.from_numpy(image) for image, _, _ in prepared])
    outputs = [out.cpu().numpy() for out in network(batch)]
    return [
        coco_results(
            unpad_detections(*(out[i] for out in outputs)),
            scale=scale,
            orig_hw=orig_hw,
            label_map=network.info.label_map,
            score_threshold=SCORE_THRESHOLD,
        )
        for i, (_, scale, orig_hw) in enumerate(prepared)
    ]


Results = list[list[dict[str, Any]]]


def parity(served: Results, reference: Results, precision: str) -> Any:
    from maskops.export.parity import coco_results_as_detections, compare_detections

    data_type = "fp32" if precision == "fp32" else "fp16"
    return compare_detections(
        [coco_results_as_detections(r) for r in reference],
        [coco_results_as_detections(s) for s in served],
        data_type=data_type,
    )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def timed_calls(call: Callable[[int], int], clients: int, seconds: float) -> dict[str, float]:
    """``clients`` threads calling ``call(client)`` (returns the images it did) for
    ``seconds``: images/s over the whole run, and the calls' p50/p99 latency in ms."""
    latencies: list[float] = []
    done = [0] * clients
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        while time.monotonic() < stop and not errors:
            start = time.perf_counter()
            try:
                done[index] += call(index)
            except BaseException as exc:
                errors.append(exc)
                return
            latencies.append((time.perf_counter() - start) * 1000)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    elapsed = time.perf_counter() - started
    return {
        "images_per_s": round(sum(done) / elapsed, 2),
        "calls": len(latencies),
        "mean_ms": round(sum(latencies) / max(len(latencies), 1), 2),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
    }


class HttpClient:
    """One client's keep-alive connection to Triton's HTTP endpoint, speaking KServe v2
    with the binary-data extension (the wire format tritonclient uses): the GPU host's
    carry has no room for tritonclient's HTTP stack (gevent), and this is all it does."""

    def __init__(self, url: str, model: str = NAME) -> None:
        import http.client

        host, port = url.rsplit(":", 1)
        self.connection = http.client.HTTPConnection(host, int(port), timeout=120)
        self.model = model

    def infer(self, image: bytes) -> list[dict[str, Any]]:
        """COCO results of one image through the ensemble (score >= SCORE_THRESHOLD)."""
        import numpy as np

        from maskops.serving.protocol import decode_detections

        threshold = np.float32(SCORE_THRESHOLD).tobytes()
        header = json.dumps(
            {
                "inputs": [
                    _binary_input("image_bytes", "UINT8", [1, len(image)], len(image)),
                    _binary_input("score_threshold", "FP32", [1, 1], len(threshold)),
                ],
                "outputs": [{"name": "detections_json", "parameters": {"binary_data": True}}],
            }
        ).encode()
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        }
        self.connection.request(
            "POST", f"/v2/models/{self.model}/infer", header + image + threshold, headers
        )
        response = self.connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"Triton answered {response.status}: {body[:300]!r}")
        start = int(response.getheader("Inference-Header-Content-Length") or len(body))
        return decode_detections(body[start:])


def _binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "name": name,
        "shape": shape,
        "datatype": datatype,
        "parameters": {"binary_data_size": size},
    }


STAT_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")
"""The parts of a request's time in a Triton model (its statistics extension): waiting in
the scheduler's queue, inputs copied in, the model's own execution, outputs copied out."""


def triton_statistics(url: str) -> dict[str, dict[str, int]]:
    """Triton's cumulative statistics of every loaded model (``GET /v2/models/stats``):
    ``{model: {"requests", "executions", "inferences", "success_ns", "<part>_ns"...}}``
    (requests: successful ones; executions: batches run; inferences: batch items)."""
    import urllib.request

    with urllib.request.urlopen(f"http://{url}/v2/models/stats", timeout=30) as answer:
        doc = json.loads(answer.read())
    totals: dict[str, dict[str, int]] = {}
    for model in doc.get("model_stats", []):
        stats = model["inference_stats"]
        row = totals.setdefault(model["name"], {})
        counts = {
            "requests": stats["success"]["count"],
            "executions": model.get("execution_count", 0),
            "inferences": model.get("inference_count", 0),
            "success_ns": stats["success"]["ns"],
            **{f"{part}_ns": stats[part]["ns"] for part in STAT_PARTS},
        }
        for key, value in counts.items():  # versions add up
            row[key] = row.get(key, 0) + int(value)
    return totals


STATISTICS_WAIT_S = 10.0
"""The longest :func:`settled_statistics` waits for Triton's statistics to catch up."""


def settled_statistics(
    url: str,
    name: str = NAME,
    *,
    since: dict[str, dict[str, int]] | None = None,
    requests: int = 0,
) -> dict[str, dict[str, int]]:
    """:func:`triton_statistics` once they count the answers already received: a backend
    reports a request's statistics after sending its response, so a reading right after
    an answer can miss it. With ``since``, waits until ensemble ``name`` and each of its
    parts count ``requests`` more successful requests than there; without, until two
    readings 0.25 s apart agree. After :data:`STATISTICS_WAIT_S`, the last reading."""
    from maskops.serving.protocol import EnsembleNames

    models = [name, *EnsembleNames(name).parts]

    def caught_up(reading: dict[str, dict[str, int]], since: dict[str, dict[str, int]]) -> bool:
        def count(stats: dict[str, dict[str, int]], model: str) -> int:
            return stats.get(model, {}).get("requests", 0)

        return all(count(reading, m) >= count(since, m) + requests for m in models)

    deadline = time.monotonic() + STATISTICS_WAIT_S
    reading = triton_statistics(url)
    while time.monotonic() < deadline:
        if since is not None and caught_up(reading, since):
            break
        time.sleep(0.25)
        reading, earlier = triton_statistics(url), reading
        if since is None and reading == earlier:
            break
    return reading


def time_in_server(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], name: str = NAME
) -> dict[str, dict[str, float]]:
    """Where the requests to ensemble ``name`` spent their time between two
    :func:`triton_statistics`, by part of the ensemble (``ensemble``, ``preprocess``,
    ``net``, ``postprocess``): the requests served, the mean batch each part executed,
    and per request the mean ms in the part (``total_ms``) and in each of
    :data:`STAT_PARTS`. A client's latency less the ensemble's ``total_ms`` is the time
    outside the server's models: HTTP, the client, and Triton's handing over."""
    from maskops.serving.protocol import EnsembleNames

    names = EnsembleNames(name)
    parts = {"ensemble": name, **{model.rsplit(".", 1)[1]: model for model in names.parts}}
    figures = {}
    for part, model in parts.items():
        earlier = before.get(model, {})
        delta = {k: v - earlier.get(k, 0) for k, v in after.get(model, {}).items()}
        requests = delta.get("requests", 0)
        if not requests:
            continue
        row = {
            "requests": requests,
            "mean_batch": round(delta["inferences"] / max(delta["executions"], 1), 2),
            "total_ms": round(delta["success_ns"] / requests / 1e6, 3),
        }
        row.update({f"{p}_ms": round(delta[f"{p}_ns"] / requests / 1e6, 3) for p in STAT_PARTS})
        figures[part] = row
    return figures


def served_figures(
    url: str, images: Sequence[bytes], seconds: float, concurrency: Sequence[int]
) -> dict[str, Any]:
    """Images/s with each count of concurrent clients of one image per call (Triton
    batches them dynamically); each run's latency per call, and where the server spent
    it (:func:`time_in_server`)."""
    figures = {}
    for count in concurrency:
        connections = [HttpClient(url) for _ in range(count)]

        def call(index: int, clients: list[HttpClient] = connections) -> int:
            clients[index].infer(images[index % len(images)])
            return 1

        call(0)  # warm: the first call of each model allocates
        before = settled_statistics(url)
        run: dict[str, Any] = timed_calls(call, count, seconds)
        after = settled_statistics(url, since=before, requests=run["calls"])
        run["in_server"] = time_in_server(before, after)
        figures[f"clients_{count}"] = run
    return figures


def eager_figures(
    network: Any, images: Sequence[bytes], seconds: float, batches: Sequence[int]
) -> dict[str, Any]:
    """In-process eager images/s at each batch size (one caller), end to end."""
    figures = {}
    for batch in batches:
        chosen = [images[i % len(images)] for i in range(batch)]
        in_process(network, chosen)  # warm

        def call(_: int, chosen: list[bytes] = chosen) -> int:
            return len(in_process(network, chosen))

        figures[f"batch_{batch}"] = timed_calls(call, 1, seconds)
    return figures


def stub_python(work: Path) -> Path:
    """The ``bin`` folder of a virtualenv over this Python for the python backend's stub,
    whose site-packages lists (a ``.pth`` file) every folder this process imports from: the
    carried wheels' site and maskops' sources, which come through ``PYTHONPATH`` here. The
    stub starts its interpreter isolated from ``PYTHONPATH`` (Triton 2.51, measured
    2026-11-27: the variable is in its environment, not on its ``sys.path``), so the
    models would not find them otherwise; nothing is installed on the host."""
    venv = work / "stub-python"
    if not (venv / "bin" / "python3").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = (venv / "lib").glob("python3*/site-packages")
    folders = [str(Path(p).resolve()) for p in sys.path if p and Path(p).is_dir()]
    (site / "maskops-gpu-check.pth").write_text("\n".join(dict.fromkeys(folders)) + "\n")
    return venv / "bin"


def serving_check(
    checkpoint: Path,
    images: Sequence[bytes],
    *,
    device: str,
    precision: str = "auto",
    work: Path,
    seconds: float = 5.0,
    concurrency: Sequence[int] = (1, 8),
    exact_twin: bool | None = None,
    served_arms: Sequence[str] = (),
    time_left: Callable[[], float] = lambda: math.inf,
    progress: Callable[[dict[str, Any]], None] = lambda _: None,
) -> dict[str, Any]:
    """Publish, serve, compare and time (see module doc); returns the figures, each
    served model's comparison under ``parity`` (``asserted``: the fp32 ones decide).

    Where the precision is autocast's, an fp32 twin of the model is published and served
    too, and its comparison is the asserted one: detections of random weights are
    ill-conditioned (measured on a CPU: the random R50 under bf16 autocast against fp32
    matched 65 % of its top-20 detections), so only fp32 compares served and in-process
    inference exactly; the autocast comparison is recorded (``exact_twin``: whether to
    publish the twin, by default where the precision is not fp32). ``concurrency``: the
    served clients and the eager batch sizes measured (the largest pair gives the
    served/eager ratio). ``served_arms``: the names in :data:`SERVED_ARMS` to measure (on
    a CPU, those that change anything there); on CUDA every :data:`EAGER_ARMS` too, all
    in :data:`TUNING_ORDER`, each only if ``time_left()`` (seconds) affords its estimate.
    ``progress`` gets the figures so far after each phase: what a run cut short keeps."""
    import torch

    from maskops.serving.torch_network import resolve_precision

    cuda = device == "cuda"
    chosen = resolve_precision(precision, torch.device("cuda", 0) if cuda else torch.device("cpu"))
    twin = chosen != "fp32" if exact_twin is None else exact_twin
    models = {NAME: chosen, EXACT_NAME: "fp32"} if twin else {NAME: chosen}
    networks = publish_all(checkpoint, work / "serving_repository", models, cuda=cuda)
    figures = served_and_compared(networks, models, images, work, seconds, concurrency)
    progress(figures)
    most = max(concurrency)
    eager = eager_figures(networks[NAME], images, seconds, concurrency)
    served_rate = figures["served"][f"clients_{most}"]["images_per_s"]
    figures["in_process_eager"] = eager
    figures[f"served_vs_eager_at_{most}"] = round(
        served_rate / eager[f"batch_{most}"]["images_per_s"], 3
    )
    progress(figures)
    planned = planned_arms(
        checkpoint, images, work, served_arms, cuda=cuda, precision=chosen, seconds=seconds,
        batch=most,
    )  # fmt: skip
    for section, key, estimate_s, measure in planned:
        left = time_left()
        if left >= estimate_s:
            figures[section][key] = measure()
        else:
            figures[section][key] = {"skipped": f"{left:.0f} s left, {estimate_s:.0f} s needed"}
        progress(figures)
    return figures


Measure = Callable[[], dict[str, Any]]


def planned_arms(
    checkpoint: Path,
    images: Sequence[bytes],
    work: Path,
    served_arms: Sequence[str],
    *,
    cuda: bool,
    precision: str,
    seconds: float,
    batch: int,
) -> list[tuple[str, str, float, Measure]]:
    """The tuning arms :func:`serving_check` runs, in :data:`TUNING_ORDER`: for each, the
    section and key of its figures, the seconds it is taken to need, and its measure."""
    planned: list[tuple[str, str, float, Measure]] = []
    for kind, arm in TUNING_ORDER:
        if kind == "served" and arm in served_arms and (cuda or not SERVED_ARMS[arm].cuda_only):
            served = functools.partial(
                served_arm, checkpoint, images, work, arm, precision=precision, cuda=cuda,
                clients=batch, seconds=seconds,
            )  # fmt: skip
            key = f"clients_{batch}_{arm}"
            planned.append(("served", key, SERVED_ARMS[arm].estimate_s, served))
        elif kind == "eager" and cuda:
            eager = functools.partial(eager_arm, checkpoint, images, arm, precision, seconds, batch)
            key = f"batch_{batch}_{arm}"
            planned.append(("in_process_eager", key, EAGER_ARMS[arm].estimate_s, eager))
    return planned


def served_and_compared(
    networks: dict[str, Any],
    models: dict[str, str],
    images: Sequence[bytes],
    work: Path,
    seconds: float,
    concurrency: Sequence[int],
) -> dict[str, Any]:
    """Serve the published ``models`` (name: precision) from one Triton: where it placed
    them, each one's answers against its in-process ``networks``' (``parity``;
    ``passed``: the fp32 comparisons decide), and the first one's served rates."""
    from maskops.serving.launcher import TritonServer
    from maskops.serving.protocol import EnsembleNames

    # One image a call on both sides: the same batch shapes, so autocast's kernels match.
    references = {
        name: [in_process(network, [image])[0] for image in images]
        for name, network in networks.items()
    }
    with TritonServer(
        work / "serving_repository",
        models=[part for name in models for part in EnsembleNames(name).load_order],
        log_file=work / "tritonserver.log",
        startup_timeout_s=300,
        python_bin=stub_python(work),
    ) as server:
        placement = network_config(server.http_url)
        reports = {
            name: parity(
                [HttpClient(server.http_url, name).infer(image) for image in images],
                references[name],
                models[name],
            ).to_json()
            for name in models
        }
        served = served_figures(server.http_url, images, seconds, concurrency)
    for report in reports.values():
        report["asserted"] = report["data_type"] == "fp32"
    return {
        "placement": placement,
        "parity": reports,
        "passed": all(r["passed"] for r in reports.values() if r["asserted"]),
        "detections": sum(len(r) for r in references[NAME]),
        "served": served,
    }


@dataclass(frozen=True)
class EagerArm:
    """A tuning arm of the in-process network: :class:`TorchNetwork`'s options."""

    options: dict[str, Any]
    estimate_s: float
    """Seconds it is taken to need on a GPU (compiling included), to skip it in time."""


EAGER_ARMS: dict[str, EagerArm] = {
    "channels_last": EagerArm({"channels_last": True}, 30.0),
    "compiled": EagerArm({"compile_mode": "default"}, 120.0),
    "graphs": EagerArm({"compile_mode": "reduce-overhead"}, 120.0),
}
"""Tuning arms of the in-process network on a GPU: NHWC weights and input (the training
default on Ampere and later); the backbone and FPN under ``torch.compile``; and compiled
to replay as CUDA graphs (TAO's image size is fixed). The compiling arms' estimates are
guesses until a GPU run times them."""


def eager_arm(
    checkpoint: Path, images: Sequence[bytes], arm: str, precision: str, seconds: float, batch: int
) -> dict[str, Any]:
    """In-process images/s at ``batch`` of :data:`EAGER_ARMS` ``arm`` on the GPU, end to
    end (a compiling arm compiles in its warm-up call); an arm that fails gives its
    error."""
    from maskops.serving.torch_network import TorchNetwork

    options = EAGER_ARMS[arm].options
    try:
        network = TorchNetwork(checkpoint, device="cuda:0", precision=precision, **options)
        timed: dict[str, Any] = eager_figures(network, images, seconds, [batch])[f"batch_{batch}"]
    except Exception as exc:  # one arm's failure is its figure; the others go on
        timed = {"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return timed


@dataclass(frozen=True)
class ServedArm:
    """A served tuning arm: how its ensemble is published."""

    instances: int = 1
    """Instances of the network model (processes; on a GPU, per GPU)."""
    processing_instances: int = 1
    """Instances of the preprocess and postprocess models each (processes on the CPU)."""
    net_settings: dict[str, Any] = field(default_factory=dict)
    """Added to the network model's settings.json."""
    cuda_only: bool = False
    """Changes nothing on a CPU."""
    estimate_s: float = 60.0
    """Seconds it is taken to need on a GPU (a server's start and loads, then the calls)."""


SERVED_ARMS: dict[str, ServedArm] = {
    "instances_2": ServedArm(instances=2, processing_instances=2),
    "processing_4": ServedArm(processing_instances=4),
    "host_outputs": ServedArm(net_settings={"outputs_via_host": True}, cuda_only=True),
}
"""Served tuning arms. ``instances_2``: one instance of each model does its host work one
batch at a time while the GPU waits. ``processing_4``: the preprocess and postprocess
models decode and encode one image at a time each, on one core, while the network runs a
batch at once. ``host_outputs``: the network copies a batch's outputs to host memory in
one go, where the CPU postprocess model reads them, instead of handing each request's over
as GPU tensors (through the python backend's CUDA memory pool, then Triton's copy to the
host)."""


TUNING_ORDER: tuple[tuple[str, str], ...] = (
    ("served", "host_outputs"),
    ("served", "processing_4"),
    ("eager", "compiled"),
    ("eager", "graphs"),
    ("served", "instances_2"),
    ("eager", "channels_last"),
)
"""The tuning arms of :data:`SERVED_ARMS` and :data:`EAGER_ARMS` in the order they run,
the likeliest to pay first: a run short of time skips the last. ``channels_last`` has run
on a GPU and lost (H200, 2026-11-28: 33.1 images/s at batch 8 against 36.7)."""


def served_arm(
    checkpoint: Path,
    images: Sequence[bytes],
    work: Path,
    arm: str,
    *,
    precision: str,
    cuda: bool,
    clients: int,
    seconds: float,
) -> dict[str, Any]:
    """Served images/s and latency of :data:`SERVED_ARMS` ``arm`` with ``clients``
    concurrent clients (a repository and a server of its own); an arm that fails gives
    its error."""
    from maskops.serving.launcher import TritonServer
    from maskops.serving.protocol import EnsembleNames

    options = SERVED_ARMS[arm]
    repository = work / f"serving_repository_{arm}"
    try:
        publish_torch(
            checkpoint,
            repository,
            NAME,
            precision,
            cuda=cuda,
            instances=options.instances,
            processing_instances=options.processing_instances,
        )
        add_net_settings(repository, NAME, options.net_settings)
        with TritonServer(
            repository,
            models=EnsembleNames(NAME).load_order,
            log_file=work / f"tritonserver_{arm}.log",
            startup_timeout_s=300,
            python_bin=stub_python(work),
        ) as server:
            run = served_figures(server.http_url, images, seconds, [clients])
    except Exception as exc:  # one arm's failure is its figure; the others go on
        return {"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
    figures: dict[str, Any] = run[f"clients_{clients}"]
    return figures


def add_net_settings(repository: Path, name: str, settings: dict[str, Any]) -> None:
    """Merge ``settings`` into the settings.json of every version of ``name``'s network."""
    from maskops.serving.protocol import EnsembleNames

    for path in (repository / EnsembleNames(name).net).glob("*/settings.json"):
        path.write_text(json.dumps(json.loads(path.read_text()) | settings))


def publish_torch(
    checkpoint: Path,
    repository: Path,
    name: str,
    precision: str,
    *,
    cuda: bool,
    instances: int = 1,
    processing_instances: int = 1,
) -> None:
    """``checkpoint`` in ``repository`` as ``name`` on the torch net backend, at
    ``precision`` on the GPU or the CPU, batches of up to 8 (publish's repository writer,
    as the API's publish job)."""
    from maskops.serving.placement import Placement
    from maskops.serving.repository import publish

    publish(
        checkpoint,
        repository,
        name,
        net_backend="torch",
        placement=Placement("gpu" if cuda else "cpu"),
        precision=precision,
        max_batch_size=8,
        instances=instances,
        processing_instances=processing_instances,
    )


def publish_all(
    checkpoint: Path, repository: Path, models: dict[str, str], *, cuda: bool
) -> dict[str, Any]:
    """Publish ``checkpoint`` under each name at its precision (:func:`publish_torch`);
    each name's in-process network on the same device and precision."""
    from maskops.serving.torch_network import TorchNetwork

    networks = {}
    for name, precision in models.items():
        publish_torch(checkpoint, repository, name, precision, cuda=cuda)
        networks[name] = TorchNetwork(
            checkpoint, device="cuda:0" if cuda else "cpu", precision=precision
        )
    return networks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--images", type=Path, required=True, help="folder of JPEG/PNG")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    files = sorted(p for p in args.images.iterdir() if p.suffix.lower() in {".jpg", ".png"})
    images = [p.read_bytes() for p in files[:8]]
    with tempfile.TemporaryDirectory() as work:
        figures = serving_check(
            args.checkpoint,
            images,
            device=args.device,
            precision=args.precision,
            work=Path(work),
            seconds=args.seconds,
        )
    text = json.dumps(figures, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if figures["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
