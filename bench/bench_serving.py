"""Serving benchmark: every arm timed in the same run, in alternated rounds.

1. The network, per backbone, image size and batch size (``--batches``): PyTorch eager
   fp32; eager bf16 + channels_last where the CPU has native bf16 kernels (skipped with a
   message elsewhere); onnxruntime fp32 and int8 QDQ. With ``--device cuda``: eager fp32,
   fp16 and bf16 (where the GPU has it) on the GPU, onnxruntime's CUDA and TensorRT
   execution providers where this onnxruntime build has them. The exported graph takes one
   image per ``session.run``: a batch of b is b runs. Each arm: p50/p90/p99 latency of a
   batch and images/s at the p50, over ``--reps`` rounds.
2. Post-processing of ``--detections`` (100): maskops paste + RLE vs torchvision's
   ``paste_masks_in_image`` + ``pycocotools.mask.encode``.
3. ``POST /infer`` through the API (``python -m maskops_api.server``, multipart upload)
   and Triton, and Triton alone (encoded image -> COCO JSON through the ensemble), each vs
   the same steps in-process (decode/resize + ONNX + post-processing): p50/p90/p99. Then,
   with Triton's dynamic batching on (the export's max_batch_size, 4) and off
   (published with max_batch_size 1): images/s through ``/infer`` with concurrent clients,
   and ``/infer`` under open-loop load: ``--open-loop-requests`` requests at fixed arrival rates
   of 0.5, 0.8 and 1.2 times that capacity, p50/p99 from each request's scheduled time;
   and the cold start: publish a new model into the running Triton, load it, first answer.

Random weights (``--detections`` per image, 100 by default: the worst case for
post-processing). Defaults run in a few minutes on 2 cores; ``--full`` runs the full
sizes (resnet18 and 50 at 512x640 and 832x1344). Figures go to bench/results/bench_serving.json
(bench_serving_full.json with ``--full``, a ``_cuda`` suffix with ``--device cuda``;
``--out`` elsewhere).

    .venv/bin/python bench/bench_serving.py [--full] [--reps N] [--no-triton]
    # on a GPU host (no GPU figure has been taken yet):
    .venv/bin/python bench/bench_serving.py --device cuda --full --batches 1 4 8 --no-triton
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import io
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pycocotools.mask as mask_util
import torch
from api_process import start_api
from machine import RunConditions, start_run, write_results
from PIL import Image
from timing import Spread, alternated_seconds
from torchvision.models.detection.roi_heads import paste_masks_in_image

from maskops.data.labels import LabelMap
from maskops.evaluation.postprocess import paste_masks_rle
from maskops.evaluation.predictor import TorchPredictor
from maskops.export.graph import GraphMetadata, set_metadata, trace_to_onnx
from maskops.export.precision import quantize_int8
from maskops.export.predictor import OnnxPredictor
from maskops.modeling import build_model
from maskops.serving.processing import coco_results, preprocess_image
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig
from maskops.training.trainer import cpu_has_native_bf16

RESULTS = Path(__file__).parent / "results" / "bench_serving.json"
OPEN_LOOP_LOADS = (0.5, 0.8, 1.2)
"""Arrival rates through ``/infer`` as fractions of the closed-loop capacity."""
BATCHING: dict[str, tuple[str, int | None]] = {
    "dynamic_batching_on": ("bench", None),
    "dynamic_batching_off": ("bench_unbatched", 1),
}
"""The model published for each mode and its Triton max_batch_size (None: the export's, 4;
1: no batching)."""
LABELS = LabelMap.from_coco_categories([{"id": i, "name": f"c{i}"} for i in (1, 2, 3)])
Predict = Callable[[list[torch.Tensor]], Any]


def config(nlayers: int, detections: int) -> MaskRCNNConfig:
    return MaskRCNNConfig(nlayers=nlayers, test_detections_per_image=detections)


def random_model(nlayers: int, image_size: tuple[int, int], detections: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(
        config(nlayers, detections), num_classes=LABELS.num_classes, image_size=image_size
    )
    # Random weights score everything alike; keep every candidate so each image has the
    # full ``detections`` (the heaviest case for masks and post-processing).
    model.roi_heads.score_thresh = 0.0
    return model.eval()


def metadata(
    nlayers: int, image_size: tuple[int, int], data_type: str, detections: int
) -> GraphMetadata:
    spec = ExperimentSpec(
        data_config=DataConfig(image_size=image_size, num_classes=LABELS.num_classes),
        maskrcnn_config=config(nlayers, detections),
    )
    return GraphMetadata(
        spec=spec,
        label_map=LABELS,
        data_type=data_type,
        image_size=image_size,
        max_detections=detections,
        mask_resolution=28,
        max_batch_size=4,
    )


def latency(spread: Spread, batch: int) -> dict[str, Any]:
    """p50/p90/p99 of one batch in ms, and images/s at the p50."""
    return {
        "p50_ms": round(spread.percentile(50) * 1e3, 2),
        "p90_ms": round(spread.percentile(90) * 1e3, 2),
        "p99_ms": round(spread.percentile(99) * 1e3, 2),
        "images_per_s": round(batch / spread.median, 3),
        "rounds": len(spread.values),
    }


def eager_arms(model: torch.nn.Module, device: torch.device) -> dict[str, Predict]:
    """PyTorch eager as a user would run it on ``device``: fp32, and the reduced precisions
    the hardware runs natively."""
    arms: dict[str, Predict] = {"eager_fp32": TorchPredictor(model.to(device), device=device)}
    if device.type == "cuda":
        arms["eager_fp16"] = TorchPredictor(model, device=device, autocast_dtype=torch.float16)
        if torch.cuda.is_bf16_supported():
            arms["eager_bf16"] = TorchPredictor(model, device=device, autocast_dtype=torch.bfloat16)
    elif cpu_has_native_bf16():
        channels_last = copy.deepcopy(model).to(memory_format=torch.channels_last)
        arms["eager_bf16_channels_last"] = TorchPredictor(
            channels_last, device=device, autocast_dtype=torch.bfloat16
        )
    else:
        print("eager bf16 + channels_last skipped: this CPU has no native bf16 kernels")
    return arms


def onnx_arms(
    graph: onnx.ModelProto, path: Path, meta: Callable[[str], GraphMetadata], device: torch.device
) -> dict[str, Predict]:
    """onnxruntime on the CPU (fp32 and int8) or, on CUDA, each GPU provider present."""
    if device.type == "cuda":
        available = ort.get_available_providers()
        arms: dict[str, Predict] = {}
        for name, provider in (
            ("ort_cuda", "CUDAExecutionProvider"),
            ("ort_tensorrt", "TensorrtExecutionProvider"),
        ):
            if provider in available:
                arms[name] = OnnxPredictor(path, providers=[provider, "CPUExecutionProvider"])
            else:
                print(f"{name} skipped: this onnxruntime build has no {provider}")
        return arms
    int8_graph, _ = quantize_int8(
        graph,
        [
            torch.rand(3, *meta("fp32").image_size, generator=torch.Generator().manual_seed(i))
            for i in range(4)
        ],
        work_dir=path.parent,
    )
    set_metadata(int8_graph, meta("int8"))
    return {
        "ort_fp32": OnnxPredictor(path, providers=["CPUExecutionProvider"]),
        "ort_int8": OnnxPredictor(
            int8_graph.SerializeToString(),
            metadata=meta("int8"),
            providers=["CPUExecutionProvider"],
        ),
    }


def bench_network(
    nlayers: int, image_size: tuple[int, int], args: argparse.Namespace, workdir: Path
) -> tuple[dict[str, Any], Path]:
    device = torch.device(args.device)
    model = random_model(nlayers, image_size, args.detections)
    image = torch.rand(3, *image_size, generator=torch.Generator().manual_seed(1))
    graph = trace_to_onnx(
        model, image_size=image_size, max_detections=args.detections, example=image[None]
    )
    set_metadata(graph, metadata(nlayers, image_size, "fp32", args.detections))
    path = workdir / f"r{nlayers}_{image_size[0]}x{image_size[1]}.onnx"
    onnx.save(graph, str(path))
    arms = {
        **eager_arms(model, device),
        **onnx_arms(
            graph, path, lambda dtype: metadata(nlayers, image_size, dtype, args.detections), device
        ),
    }
    row: dict[str, Any] = {"backbone": f"resnet{nlayers}", "image_size": list(image_size)}
    for batch in args.batches:
        images = [image] * batch
        timed = alternated_seconds(
            [lambda fn=fn, images=images: fn(images) for fn in arms.values()], args.reps
        )
        figures = {name: latency(spread, batch) for name, spread in zip(arms, timed, strict=True)}
        eager = min(f["p50_ms"] for n, f in figures.items() if n.startswith("eager"))
        ort_best = min(
            (f["p50_ms"] for n, f in figures.items() if n.startswith("ort") and n != "ort_int8"),
            default=None,
        )
        row[f"batch_{batch}"] = {
            "arms": figures,
            "best_ort_speedup_vs_best_eager": round(eager / ort_best, 3) if ort_best else None,
        }
        print(
            f"resnet{nlayers} {image_size} batch {batch}: "
            + ", ".join(f"{n} p50 {f['p50_ms']:.0f} ms" for n, f in figures.items())
            + (f"; best ORT {eager / ort_best:.2f}x the best eager" if ort_best else ""),
            flush=True,
        )
    return row, path


def bench_postprocess(image_hw: tuple[int, int], n: int, reps: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(n, 2, generator=gen) * torch.tensor([image_hw[1] * 0.8, image_hw[0] * 0.8])
    wh = torch.rand(n, 2, generator=gen) * torch.tensor([image_hw[1] * 0.3, image_hw[0] * 0.3])
    boxes = torch.cat([xy, xy + wh + 4], dim=1)
    probs = torch.rand(n, 1, 28, 28, generator=gen)

    def reference() -> list[dict[str, Any]]:
        pasted = paste_masks_in_image(probs, boxes, image_hw)[:, 0] > 0.5
        array = np.asfortranarray(pasted.permute(1, 2, 0).numpy().astype(np.uint8))
        return list(mask_util.encode(array))

    def ours() -> list[dict[str, Any]]:
        return paste_masks_rle(boxes, probs, image_hw)

    ref, mine = alternated_seconds([reference, ours], reps)
    print(
        f"post-processing {n} detections {image_hw}: torchvision+pycocotools "
        f"{ref.median * 1e3:.1f} ms, maskops {mine.median * 1e3:.1f} ms "
        f"({ref.median / mine.median:.1f}x)"
    )
    return {
        "image_hw": list(image_hw),
        "torchvision_pycocotools": latency(ref, 1),
        "maskops": latency(mine, 1),
        "speedup": round(ref.median / mine.median, 2),
    }


def encoded_image(height: int, width: int) -> bytes:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(
        buffer, format="JPEG", quality=90
    )
    return buffer.getvalue()


def register_published(database_url: str, name: str) -> None:
    """The rows a publish job leaves: ``/infer`` answers only for a published model."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from maskops_core.db.models import Job, PublishedModel

    engine = create_engine(database_url)
    with Session(engine) as session, session.begin():
        export = Job(action="export", status="succeeded", queue="gpu", options={})
        session.add(export)
        session.flush()
        session.add(PublishedModel(name=name, version=1, job_id=export.id))
    engine.dispose()


@contextlib.contextmanager
def api_server(triton_url: str, models: tuple[str, ...]) -> Iterator[str]:
    """The API as deployed (its own process), on SQLite, pointed at ``triton_url``, with
    ``models`` published."""
    with tempfile.TemporaryDirectory() as home:
        database_url = f"sqlite:///{home}/maskops.db"
        process, base = start_api(
            {
                "MASKOPS_DATABASE_URL": database_url,
                "MASKOPS_BROKER_URL": "memory://",
                "MASKOPS_DATA_ROOT": home,
                "MASKOPS_TRITON_URL": triton_url,
            }
        )
        try:
            for model in models:
                register_published(database_url, model)
            yield base
        finally:
            process.terminate()
            process.wait(30)


def closed_loop_images_per_s(call: Callable[[], Any], clients: int, seconds: float) -> float:
    """Images/s with ``clients`` threads each sending its next request when answered."""
    done = 0
    stop = threading.Event()
    lock = threading.Lock()

    def worker() -> None:
        nonlocal done
        while not stop.is_set():
            call()
            with lock:
                done += 1

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return done / (time.perf_counter() - start)


def open_loop(call: Callable[[], Any], rate: float, requests: int) -> dict[str, Any]:
    """Send ``requests`` calls at a fixed arrival rate, whether earlier ones are answered.

    Each call starts at its scheduled time on its own thread; its latency counts from that
    time (not from when a busy client got round to it), so a server that falls behind shows
    its queueing in the percentiles instead of silently slowing the arrivals down.
    """
    latencies: list[float] = [0.0] * requests
    failures = 0
    lock = threading.Lock()

    def one(index: int, scheduled: float) -> None:
        nonlocal failures
        try:
            call()
        except Exception:
            with lock:
                failures += 1
        latencies[index] = time.perf_counter() - scheduled

    start = time.perf_counter()
    threads = []
    for index in range(requests):
        scheduled = start + index / rate
        time.sleep(max(0.0, scheduled - time.perf_counter()))
        thread = threading.Thread(target=one, args=(index, scheduled))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    ms = np.array(latencies) * 1e3
    return {
        "rate_per_s": round(rate, 3),
        "requests": requests,
        "failures": failures,
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "images_per_s": round((requests - failures) / elapsed, 3),
    }


def bench_open_loop(
    call: Callable[[], Any], capacity: float, requests: int, loads: tuple[float, ...]
) -> list[dict[str, Any]]:
    """``open_loop`` at each fraction of ``capacity`` (images/s), p99 against p50."""
    rows = []
    for load in loads:
        row = {"load": load, **open_loop(call, load * capacity, requests)}
        row["p99_over_p50"] = round(row["p99_ms"] / row["p50_ms"], 2)
        print(
            f"/infer open loop at {load:.1f}x capacity ({row['rate_per_s']:.2f}/s, "
            f"{requests} requests): p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms "
            f"({row['p99_over_p50']}x), {row['images_per_s']:.2f} img/s, "
            f"{row['failures']} failed"
        )
        rows.append(row)
    return rows


def infer_under_load(
    call: Callable[[], Any], clients: int, seconds: float, open_loop_requests: int
) -> dict[str, Any]:
    """Capacity (images/s with ``clients`` closed-loop clients), then the open loop at
    :data:`OPEN_LOOP_LOADS` of it."""
    capacity = closed_loop_images_per_s(call, clients, seconds)
    print(f"/infer, {clients} concurrent clients: {capacity:.2f} img/s", flush=True)
    return {
        "capacity_images_per_s": round(capacity, 3),
        "open_loop": bench_open_loop(call, capacity, open_loop_requests, OPEN_LOOP_LOADS),
    }


def bench_triton(
    onnx_path: Path,
    reps: int,
    clients: int,
    seconds: float,
    open_loop_requests: int,
    conditions: RunConditions,
) -> dict[str, Any]:
    """In-process, Triton and ``POST /infer`` latency alternated, ``/infer`` under load
    with and without dynamic batching, and a cold start; the run's clock ends while the
    server runs (``conditions.end_now``), so its workers count as the run's own."""
    from maskops.serving import EnsembleNames, publish
    from maskops.serving import client as triton
    from maskops.serving.launcher import TritonServer

    predictor = OnnxPredictor(onnx_path, providers=["CPUExecutionProvider"])
    data = encoded_image(480, 640)
    models = tuple(model for model, _ in BATCHING.values())

    def in_process() -> list[dict[str, Any]]:
        image, scale, orig_hw = preprocess_image(data, predictor.image_size)
        output = predictor([torch.from_numpy(image)])[0]
        return coco_results(
            output,
            scale=scale,
            orig_hw=orig_hw,
            label_map=predictor.metadata.label_map,
            score_threshold=0.0,
        )

    with tempfile.TemporaryDirectory() as repo_dir:
        repo = Path(repo_dir)
        for model, max_batch_size in BATCHING.values():
            publish(onnx_path, repo, model, max_batch_size=max_batch_size)
        load_order = [name for model in models for name in EnsembleNames(model).load_order]
        with TritonServer(repo, models=load_order) as server:
            url = server.http_url
            with api_server(server.http_url.removeprefix("http://"), models) as api:

                def through_api(model: str = "bench") -> None:
                    files = {"images": ("image.jpg", data, "image/jpeg")}
                    response = httpx.post(
                        f"{api}/infer", params={"model": model}, files=files, timeout=120
                    )
                    response.raise_for_status()

                local, remote, via_api = alternated_seconds(
                    [in_process, lambda: triton.infer_images(url, "bench", [data]), through_api],
                    reps,
                )
                under_load = {
                    mode: infer_under_load(
                        functools.partial(through_api, model), clients, seconds, open_loop_requests
                    )
                    for mode, (model, _) in BATCHING.items()
                }
            cold_start = time.perf_counter()
            publish(onnx_path, repo, "bench_cold")
            triton.roll_out(url, "bench_cold")
            triton.infer_images(url, "bench_cold", [data])
            cold_start_s = time.perf_counter() - cold_start
            conditions.end_now()
    figures = {
        "in_process": latency(local, 1),
        "triton": latency(remote, 1),
        "api_infer": latency(via_api, 1),
        "triton_p50_overhead": round(remote.median / local.median - 1, 4),
        "api_infer_p50_overhead": round(via_api.median / local.median - 1, 4),
        "concurrent_clients": clients,
        "api_infer_under_load": under_load,
        "cold_start_s": round(cold_start_s, 2),
    }
    print(
        f"POST /infer (API + Triton) p50 {via_api.median * 1e3:.0f} ms, Triton alone "
        f"{remote.median * 1e3:.0f} ms, in-process {local.median * 1e3:.0f} ms: overhead "
        f"{figures['api_infer_p50_overhead']:+.1%}; cold start (publish, load, first answer) "
        f"{cold_start_s:.1f} s"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="resnet18+50, 512x640 + 832x1344")
    parser.add_argument("--nlayers", type=int, default=18, help="backbone without --full")
    parser.add_argument("--image-size", type=int, nargs=2, default=[256, 320])
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    parser.add_argument("--detections", type=int, default=100, help="per image")
    parser.add_argument("--reps", type=int, default=5, help="rounds: each arm once per round")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--postprocess-hw",
        type=int,
        nargs=2,
        action="append",
        help="image size(s) of the post-processing comparison (default 480 640 and 832 1344)",
    )
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--open-loop-requests", type=int, default=200, help="per arrival rate through /infer"
    )
    parser.add_argument("--require-idle", action="store_true", help="refuse to run when loaded")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here")
    conditions = start_run(require_idle=args.require_idle)
    if args.full:
        # 640x480 images go in at (512, 640): image_size must be a multiple of 2**max_level
        # (64), so the 480 rows are padded to 512 as the pipeline pads them.
        configs = [(n, s) for n in (18, 50) for s in ((512, 640), (832, 1344))]
    else:
        configs = [(args.nlayers, tuple(args.image_size))]
    results: dict[str, Any] = {"device": args.device, "network": [], "postprocess": []}
    with tempfile.TemporaryDirectory() as work:
        first_onnx: Path | None = None
        for nlayers, size in configs:
            row, path = bench_network(nlayers, size, args, Path(work))
            results["network"].append(row)
            first_onnx = first_onnx or path
        for hw in args.postprocess_hw or [(480, 640), (832, 1344)]:
            results["postprocess"].append(bench_postprocess(tuple(hw), args.detections, args.reps))
        if not args.no_triton and first_onnx is not None:
            results["triton"] = bench_triton(
                first_onnx,
                args.reps,
                args.clients,
                args.seconds,
                args.open_loop_requests,
                conditions,
            )
    name = (
        "bench_serving"
        + ("_full" if args.full else "")
        + ("_cuda" if args.device == "cuda" else "")
    )
    out = args.out or RESULTS.with_name(f"{name}.json")
    write_results(out, results, conditions)


if __name__ == "__main__":
    main()
