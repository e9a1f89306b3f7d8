"""Serving benchmark: ratios measured in one run (issue 7).

1. onnxruntime fp32 vs PyTorch eager (CPU), per backbone and image size (goal >= 1.3x).
2. onnxruntime int8 QDQ vs fp32.
3. Post-processing of 100 detections: maskops paste + RLE vs torchvision's
   ``paste_masks_in_image`` + ``pycocotools.mask.encode`` (goal >= 5x).
4. ``POST /infer`` through the API (``python -m maskops_api.server``, multipart upload)
   and Triton, and Triton alone (encoded image -> COCO JSON through the ensemble), each vs
   the same steps in-process (decode/resize + ONNX + post-processing): p50 overhead (goal
   <= 15 %), and throughput with concurrent clients (dynamic batching on).

Random weights (100 detections per image: the worst case for post-processing). Defaults
run in a few minutes on 2 cores; ``--full`` runs the issue's sizes (resnet18 and 50 at
480x640 and 832x1344). Figures go to bench/results/bench_serving.json
(bench_serving_full.json with ``--full``).

    .venv/bin/python bench/bench_serving.py [--full] [--reps N] [--no-triton]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pycocotools.mask as mask_util
import torch
from api_process import start_api
from machine import describe_machine
from PIL import Image
from timing import paired_median_seconds
from torchvision.models.detection.roi_heads import paste_masks_in_image

from maskops.data.labels import LabelMap
from maskops.evaluation.postprocess import paste_masks_rle
from maskops.export.graph import GraphMetadata, set_metadata, trace_to_onnx
from maskops.export.precision import quantize_int8
from maskops.export.predictor import OnnxPredictor
from maskops.modeling import build_model
from maskops.serving.processing import coco_results, preprocess_image
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

RESULTS = Path(__file__).parent / "results" / "bench_serving.json"
LABELS = LabelMap.from_coco_categories([{"id": i, "name": f"c{i}"} for i in (1, 2, 3)])


def random_model(nlayers: int, image_size: tuple[int, int]) -> torch.nn.Module:
    torch.manual_seed(0)
    config = MaskRCNNConfig(nlayers=nlayers)
    model = build_model(config, num_classes=LABELS.num_classes, image_size=image_size)
    # Random weights score everything alike; keep every candidate so each image has the
    # full 100 detections (the heaviest case for masks and post-processing).
    model.roi_heads.score_thresh = 0.0
    return model.eval()


def metadata(nlayers: int, image_size: tuple[int, int], data_type: str) -> GraphMetadata:
    spec = ExperimentSpec(
        data_config=DataConfig(image_size=image_size, num_classes=LABELS.num_classes),
        maskrcnn_config=MaskRCNNConfig(nlayers=nlayers),
    )
    return GraphMetadata(
        spec=spec,
        label_map=LABELS,
        data_type=data_type,
        image_size=image_size,
        max_detections=100,
        mask_resolution=28,
        max_batch_size=4,
    )


def bench_network(
    nlayers: int, image_size: tuple[int, int], reps: int, workdir: Path
) -> tuple[dict[str, Any], Path]:
    model = random_model(nlayers, image_size)
    image = torch.rand(3, *image_size, generator=torch.Generator().manual_seed(1))
    graph = trace_to_onnx(model, image_size=image_size, max_detections=100, example=image[None])
    set_metadata(graph, metadata(nlayers, image_size, "fp32"))
    fp32_path = workdir / f"r{nlayers}_{image_size[0]}x{image_size[1]}.onnx"
    onnx.save(graph, str(fp32_path))
    fp32 = OnnxPredictor(fp32_path, providers=["CPUExecutionProvider"])
    calib = [
        torch.rand(3, *image_size, generator=torch.Generator().manual_seed(i)) for i in range(4)
    ]
    int8_graph, _ = quantize_int8(graph, calib, work_dir=workdir)
    set_metadata(int8_graph, metadata(nlayers, image_size, "int8"))
    int8 = OnnxPredictor(
        int8_graph.SerializeToString(),
        metadata=metadata(nlayers, image_size, "int8"),
        providers=["CPUExecutionProvider"],
    )

    def eager() -> None:
        with torch.inference_mode():
            model([image])

    eager_s, ort_s, int8_s = paired_median_seconds(
        [eager, lambda: fp32([image]), lambda: int8([image])], reps
    )
    row = {
        "backbone": f"resnet{nlayers}",
        "image_size": list(image_size),
        "eager_fp32_s": eager_s,
        "ort_fp32_s": ort_s,
        "ort_int8_s": int8_s,
        "ort_fp32_speedup_vs_eager": eager_s / ort_s,
        "ort_int8_speedup_vs_fp32": ort_s / int8_s,
    }
    print(
        f"resnet{nlayers} {image_size}: eager {eager_s:.3f} s, ORT fp32 {ort_s:.3f} s "
        f"({row['ort_fp32_speedup_vs_eager']:.2f}x), int8 {int8_s:.3f} s "
        f"({row['ort_int8_speedup_vs_fp32']:.2f}x vs fp32)"
    )
    return row, fp32_path


def bench_postprocess(image_hw: tuple[int, int], reps: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    n = 100
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

    ref_s, ours_s = paired_median_seconds([reference, ours], reps)
    print(
        f"post-processing 100 detections {image_hw}: torchvision+pycocotools {ref_s * 1e3:.1f}"
        f" ms, maskops {ours_s * 1e3:.1f} ms ({ref_s / ours_s:.1f}x)"
    )
    return {
        "image_hw": list(image_hw),
        "torchvision_pycocotools_s": ref_s,
        "maskops_s": ours_s,
        "speedup": ref_s / ours_s,
    }


def encoded_image(height: int, width: int) -> bytes:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(
        buffer, format="JPEG", quality=90
    )
    return buffer.getvalue()


@contextlib.contextmanager
def api_server(triton_url: str) -> Iterator[str]:
    """The API as deployed (its own process), on SQLite, pointed at ``triton_url``."""
    with tempfile.TemporaryDirectory() as home:
        process, base = start_api(
            {
                "MASKOPS_DATABASE_URL": f"sqlite:///{home}/maskops.db",
                "MASKOPS_BROKER_URL": "memory://",
                "MASKOPS_DATA_ROOT": home,
                "MASKOPS_TRITON_URL": triton_url,
            }
        )
        try:
            yield base
        finally:
            process.terminate()
            process.wait(30)


def bench_triton(onnx_path: Path, reps: int, clients: int, seconds: float) -> dict[str, Any]:
    from maskops.serving import EnsembleNames, publish
    from maskops.serving import client as triton
    from maskops_triton.launcher import TritonServer

    predictor = OnnxPredictor(onnx_path, providers=["CPUExecutionProvider"])
    data = encoded_image(480, 640)

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
        publish(onnx_path, repo, "bench")
        with TritonServer(repo, models=EnsembleNames("bench").load_order) as server:
            url = server.http_url
            with api_server(server.http_url.removeprefix("http://")) as api:

                def through_api() -> None:
                    files = {"images": ("image.jpg", data, "image/jpeg")}
                    response = httpx.post(
                        f"{api}/infer", params={"model": "bench"}, files=files, timeout=120
                    )
                    response.raise_for_status()

                local_s, remote_s, api_s = paired_median_seconds(
                    [in_process, lambda: triton.infer_images(url, "bench", [data]), through_api],
                    reps,
                )
            done = 0
            stop = threading.Event()
            lock = threading.Lock()

            def worker() -> None:
                nonlocal done
                while not stop.is_set():
                    triton.infer_images(url, "bench", [data])
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
            throughput = done / (time.perf_counter() - start)
    overhead, api_overhead = remote_s / local_s - 1, api_s / local_s - 1
    print(
        f"POST /infer (API + Triton) p50 {api_s * 1e3:.0f} ms, Triton alone {remote_s * 1e3:.0f}"
        f" ms, in-process {local_s * 1e3:.0f} ms: overhead {api_overhead:+.1%} "
        f"(Triton alone {overhead:+.1%}); {clients} concurrent clients: {throughput:.2f} img/s"
    )
    return {
        "in_process_p50_s": local_s,
        "triton_p50_s": remote_s,
        "api_infer_p50_s": api_s,
        "overhead": overhead,
        "api_infer_overhead": api_overhead,
        "concurrent_clients": clients,
        "throughput_img_s": throughput,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="resnet18+50, 512x640 + 832x1344")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.full:
        # 640x480 images go in at (512, 640): image_size must be a multiple of 2**max_level
        # (64), so the 480 rows are padded to 512 as the pipeline pads them.
        configs = [(n, s) for n in (18, 50) for s in ((512, 640), (832, 1344))]
    else:
        configs = [(18, (256, 320))]
    results: dict[str, Any] = {
        "device": "cpu",
        "machine": describe_machine(),
        "network": [],
        "postprocess": [],
    }
    with tempfile.TemporaryDirectory() as work:
        first_onnx: Path | None = None
        for nlayers, size in configs:
            row, path = bench_network(nlayers, size, args.reps, Path(work))
            results["network"].append(row)
            first_onnx = first_onnx or path
        for hw in ((480, 640), (832, 1344)):
            results["postprocess"].append(bench_postprocess(hw, max(args.reps, 5)))
        if not args.no_triton and first_onnx is not None:
            results["triton"] = bench_triton(first_onnx, args.reps, args.clients, args.seconds)
    out = RESULTS.with_name("bench_serving_full.json") if args.full else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
