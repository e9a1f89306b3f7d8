"""Per-image cost of each host step around the network, served and in process.

The served ensemble runs the preprocess and postprocess python models
(maskops/serving/triton_models, numpy and Pillow); in-process inference runs
maskops/serving/processing.py (torch). Both are timed here on this machine's CPU, without
Triton and without the network, at the GPU check's serving size: resnet50-FPN at
832x1344, the demo data's 256x256 JPEGs, up to 100 detections an image with 28x28 masks.

The python models run as Triton runs them, one request of one image at a time, with a
stand-in for ``triton_python_backend_utils`` (inputs as read-only arrays, outputs taken
as they are handed over: the stub's own copy into shared memory is not counted).

Network outputs (``--outputs``): ``network`` runs a random-weight resnet50-FPN
(bench/gpu_serving.py's ``random_checkpoint``) once in fp32 on the CPU (a few seconds an
image on 2 cores) and keeps its padded outputs, as the network model hands them on;
``synthetic`` makes 100 detections an image with boxes inside the image and smooth random
mask probabilities, in no time.

Every step is timed once per round, in turn (bench/timing.py), and reported as
milliseconds per image: the median over the rounds, and the range.

    .venv/bin/python bench/bench_serving_steps.py [--outputs network|synthetic]
        [--images 8] [--rounds 15] [--threads 1] [--clock wall|cpu] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "maskops" / "serving" / "triton_models"
IMAGE_SIZE = (832, 1344)
NLAYERS = 50
DETECTIONS = 100
MASK = 28
SCORE_THRESHOLD = 0.05  # bench/gpu_serving.py's
CATEGORIES = ("circle", "square", "triangle")


# --------------------------------------------------------------------------- Triton stand-in


class _Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self.name = name
        self.array = np.from_dlpack(array)


class _Response:
    def __init__(self, output_tensors: Sequence[_Tensor] = (), error: Any = None) -> None:
        self.output_tensors = list(output_tensors)
        self.error = error


def _pb_utils() -> types.ModuleType:
    """What the python models use of ``triton_python_backend_utils``."""
    module = types.ModuleType("triton_python_backend_utils")
    module.get_input_tensor_by_name = lambda request, name: request[name]  # type: ignore[attr-defined]
    module.Tensor = types.SimpleNamespace(from_dlpack=_Tensor)  # type: ignore[attr-defined]
    module.InferenceResponse = _Response  # type: ignore[attr-defined]
    module.TritonError = RuntimeError  # type: ignore[attr-defined]
    return module


def _request(**arrays: np.ndarray) -> dict[str, np.ndarray]:
    """Inputs as the stub gives them: read-only arrays."""
    request = {}
    for name, array in arrays.items():
        frozen = np.ascontiguousarray(array).copy()
        frozen.flags.writeable = False
        request[name] = frozen
    return request


def load_model(part: str, version_dir: Path) -> Any:
    """``triton_models/<part>/model.py``'s ``TritonPythonModel``, initialised on
    ``version_dir`` (its settings.json / label_map.json)."""
    sys.modules.setdefault("triton_python_backend_utils", _pb_utils())
    if str(MODELS) not in sys.path:  # publish copies the ops file next to model.py
        sys.path.insert(0, str(MODELS))
    spec = importlib.util.spec_from_file_location(f"bench_{part}_model", MODELS / part / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize(
        {
            "model_repository": str(version_dir.parent),
            "model_version": "1",
            "model_config": json.dumps(served_config(part)),
        }
    )
    return model


def served_config(part: str) -> dict[str, Any]:
    """What of its config.pbtxt (as Triton's JSON) the model reads: the preprocess
    model's image output, of the torch network's type (the GPU check serves that one)."""
    from maskops.serving.model_configs import image_type
    from maskops.serving.protocol import NET_INPUT

    if part != "preprocess":
        return {}
    return {"output": [{"name": NET_INPUT, "data_type": image_type("torch")}]}


# --------------------------------------------------------------------------- inputs


def demo_images(work: Path, count: int) -> list[bytes]:
    """The GPU check's serving images: the demo data's 256x256 validation JPEGs."""
    from maskops.data.demo import generate_demo_dataset

    demo = generate_demo_dataset(
        work / "demo", num_images=60, image_size=(256, 256), seed=0, val_fraction=0.25
    )
    files = sorted(Path(demo.val_images).glob("*.jpg"))
    return [files[i % len(files)].read_bytes() for i in range(count)]


def network_outputs(work: Path, images: Sequence[bytes]) -> list[list[np.ndarray]]:
    """The five padded outputs of a random resnet50-FPN for each image (fp32, CPU)."""
    import torch
    from gpu_serving import random_checkpoint

    from maskops.serving.processing import preprocess_image
    from maskops.serving.torch_network import TorchNetwork

    checkpoint = random_checkpoint(work / "model.pth", size=IMAGE_SIZE, nlayers=NLAYERS)
    network = TorchNetwork(checkpoint, device="cpu", precision="fp32")
    outputs = []
    for data in images:
        image = torch.from_numpy(preprocess_image(data, IMAGE_SIZE)[0])[None]
        outputs.append([out[0].cpu().numpy() for out in network(image)])
    return outputs


def synthetic_outputs(
    images: Sequence[bytes], prepared: Sequence[tuple[float, tuple[int, int]]]
) -> list[list[np.ndarray]]:
    """100 detections an image: boxes inside the image (network frame), mask maps bilinear
    upsampled from 7x7 noise (blobs, as a mask head gives, rather than pixel noise)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    outputs = []
    for scale, (height, width) in prepared:
        frame_h, frame_w = height * scale, width * scale
        x0 = rng.uniform(0, frame_w * 0.9, DETECTIONS)
        y0 = rng.uniform(0, frame_h * 0.9, DETECTIONS)
        x1 = np.minimum(x0 + rng.uniform(8, frame_w / 2, DETECTIONS), frame_w)
        y1 = np.minimum(y0 + rng.uniform(8, frame_h / 2, DETECTIONS), frame_h)
        boxes = np.stack([x0, y0, x1, y1], axis=1).astype(np.float32)
        scores = np.sort(rng.uniform(0.05, 1.0, DETECTIONS).astype(np.float32))[::-1].copy()
        labels = rng.integers(1, len(CATEGORIES) + 1, DETECTIONS).astype(np.int64)
        masks = np.stack(
            [
                np.asarray(
                    Image.fromarray(rng.random((7, 7), dtype=np.float32), mode="F").resize(
                        (MASK, MASK), Image.Resampling.BILINEAR
                    )
                )
                for _ in range(DETECTIONS)
            ]
        ).astype(np.float32)
        counts = np.array([DETECTIONS], np.int32)
        outputs.append([np.asarray(a) for a in (boxes, scores, labels, masks, counts)])
    return outputs


# --------------------------------------------------------------------------- steps

COMPARED = {
    "preprocessing": (
        "served preprocess model (1 image a request)",
        "in-process preprocess_image",
    ),
    "postprocessing": (
        "served postprocess model (1 image a request)",
        "in-process unpad_detections + coco_results",
    ),
}
"""The same work on both paths, the served (numpy, in Triton's python models) against
the in-process (torch): the baseline each served step is measured against in one run."""


def steps(
    work: Path, images: Sequence[bytes], outputs: Sequence[Sequence[np.ndarray]]
) -> dict[str, Callable[[], Any]]:
    """Each step as a call over all images (its time / len(images): ms per image)."""
    from maskops.data.labels import LabelMap
    from maskops.data.transforms import resize_and_pad
    from maskops.evaluation.images import read_image
    from maskops.evaluation.postprocess import boxes_to_original, paste_masks_rle
    from maskops.serving import processing
    from maskops.serving.triton_models import maskops_serving_ops as ops

    label_map = LabelMap.from_coco_categories(
        [{"id": i, "name": name} for i, name in enumerate(CATEGORIES, 1)]
    )
    version = work / "repository" / "model" / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "settings.json").write_text(json.dumps({"image_size": list(IMAGE_SIZE)}))
    (version / "label_map.json").write_text(json.dumps(label_map.to_json()))
    pre_model = load_model("preprocess", version)
    post_model = load_model("postprocess", version)
    categories = ops.categories_from_label_map(label_map.to_json())

    prepared = [ops.preprocess(data, IMAGE_SIZE) for data in images]
    scales = [float(np.float32(scale)) for _, scale, _ in prepared]  # Triton carries FP32
    sizes = [hw for _, _, hw in prepared]
    pre_requests = [_request(image_bytes=np.frombuffer(d, np.uint8)[None]) for d in images]
    post_requests = [
        _request(
            **{name: out[None] for name, out in zip(ops.NET_OUTPUTS, outs, strict=True)},
            scale=np.array([[scale]], np.float32),
            orig_hw=np.array([hw], np.int32),
            score_threshold=np.array([[SCORE_THRESHOLD]], np.float32),
        )
        for outs, scale, hw in zip(outputs, scales, sizes, strict=True)
    ]
    decoded = [ops.load_rgb(data, fit=IMAGE_SIZE) for data in images]
    tensors = [read_image(data) for data in images]
    served_kept = []
    for outs, scale, hw in zip(outputs, scales, sizes, strict=True):
        boxes, scores, _, masks = ops.unpad(*outs)
        keep = scores >= np.float32(SCORE_THRESHOLD)
        original = ops.boxes_to_original(boxes[keep], scale=scale, orig_hw=hw)
        served_kept.append((original, masks[keep], hw))
    engine_kept = []
    for outs, (_, scale, hw) in zip(outputs, prepared, strict=True):
        output = processing.unpad_detections(*outs)
        kept = output["scores"] >= SCORE_THRESHOLD
        in_image = boxes_to_original(output["boxes"][kept], scale=scale, orig_hw=hw)
        engine_kept.append((in_image, output["masks"][kept], hw))

    def served_post(i: int) -> list[dict[str, Any]]:
        boxes, scores, labels, masks = ops.unpad(*outputs[i])
        return ops.detections_to_coco(
            boxes,
            scores,
            labels,
            masks,
            scale=scales[i],
            orig_hw=sizes[i],
            categories=categories,
            score_threshold=SCORE_THRESHOLD,
        )

    def engine_post(i: int) -> list[dict[str, Any]]:
        return processing.coco_results(
            processing.unpad_detections(*outputs[i]),
            scale=prepared[i][1],
            orig_hw=sizes[i],
            label_map=label_map,
            score_threshold=SCORE_THRESHOLD,
        )

    served_results = [served_post(i) for i in range(len(images))]
    engine_results = [engine_post(i) for i in range(len(images))]
    n = range(len(images))
    return {
        "served preprocess model (1 image a request)": lambda: [
            pre_model.execute([r]) for r in pre_requests
        ],
        "  ops.load_rgb: JPEG decode": lambda: [ops.load_rgb(d, fit=IMAGE_SIZE) for d in images],
        "  ops.resize_and_pad: resize, pad (uint8, the torch network's input)": lambda: [
            ops.resize_and_pad(image, IMAGE_SIZE, hw, out=np.empty((3, *IMAGE_SIZE), np.uint8))
            for image, hw in decoded
        ],
        "served postprocess model (1 image a request)": lambda: [
            post_model.execute([r]) for r in post_requests
        ],
        "  ops.detections_to_coco": lambda: [served_post(i) for i in n],
        "    ops.paste_masks_rle: paste, RLE": lambda: [
            ops.paste_masks_rle(boxes, masks, hw) for boxes, masks, hw in served_kept
        ],
        "  ops.encode_detections: JSON": lambda: [ops.encode_detections(r) for r in served_results],
        "in-process preprocess_image": lambda: [
            processing.preprocess_image(d, IMAGE_SIZE) for d in images
        ],
        "  read_image: JPEG decode": lambda: [read_image(d) for d in images],
        "  resize_and_pad (torch): resize, pad, /255": lambda: [
            resize_and_pad(t, IMAGE_SIZE) for t in tensors
        ],
        "in-process unpad_detections + coco_results": lambda: [engine_post(i) for i in n],
        "  paste_masks_rle (torch): paste, RLE": lambda: [
            paste_masks_rle(boxes, masks, hw) for boxes, masks, hw in engine_kept
        ],
        "in-process encode_results: JSON": lambda: [
            processing.encode_results(r) for r in engine_results
        ],
    }


def _timed(fn: Callable[[], Any], clock: Callable[[], float]) -> Callable[[], float]:
    def measure() -> float:
        start = clock()
        fn()
        return clock() - start

    return measure


def detections_kept(outputs: Sequence[Sequence[np.ndarray]]) -> list[int]:
    return [
        int((outs[1][: int(outs[4].reshape(-1)[0])] >= SCORE_THRESHOLD).sum()) for outs in outputs
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", choices=["network", "synthetic"], default="network")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)"
    )
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: this process's CPU time (all its threads), which other work on a shared "
        "machine inflates less than wall time",
    )
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args()
    if args.threads:
        import torch

        # On a small shared machine torch's OpenMP threads wait for each other behind other
        # work (a 3 ms preprocess_image took 32 ms on 2 busy cores): one thread measures
        # the steps' own cost.
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import start_run, write_results
    from timing import alternate

    from maskops.serving.triton_models import maskops_serving_ops as ops

    conditions = start_run()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        images = demo_images(work, args.images)
        if args.outputs == "network":
            outputs = network_outputs(work, images)
        else:
            prepared = [ops.preprocess(d, IMAGE_SIZE)[1:] for d in images]
            outputs = synthetic_outputs(images, prepared)
        named = steps(work, images, outputs)
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        spreads = alternate([_timed(fn, clock) for fn in named.values()], rounds=args.rounds)
    per_image = 1000.0 / len(images)
    figures = {
        "config": {
            "image_size": list(IMAGE_SIZE),
            "images": len(images),
            "image_hw": sorted({tuple(ops.load_rgb(d)[1]) for d in images}),
            "outputs": args.outputs,
            "detections_kept": detections_kept(outputs),
            "mask": MASK,
            "score_threshold": SCORE_THRESHOLD,
            "torch_threads": args.threads or "default",
            "clock": args.clock,
        },
        "ms_per_image": {
            name.strip(): spread.summary("ms", scale=per_image, digits=2)
            for name, spread in zip(named, spreads, strict=True)
        },
    }
    medians = {name.strip(): spread.median for name, spread in zip(named, spreads, strict=True)}
    figures["served_vs_in_process"] = {
        step: round(medians[served] / medians[engine], 3)
        for step, (served, engine) in COMPARED.items()
    }
    record = conditions.record()
    machine = record["machine"]
    print(
        f"{machine['cpu']} ({' '.join(machine['isa'])}), {machine['cpus']} cores, "
        f"load {record['load_average']}"
    )
    print(
        f"{args.outputs} outputs, detections kept per image: {figures['config']['detections_kept']}"
    )
    print(f"{'step':<48} {'ms/image':>9}  (min - max over {args.rounds} rounds, {args.clock})")
    for name, spread in zip(named, spreads, strict=True):
        low, high = min(spread.values) * per_image, max(spread.values) * per_image
        print(f"{name:<48} {spread.median * per_image:9.2f}  ({low:.2f} - {high:.2f})")
    for step, ratio in figures["served_vs_in_process"].items():
        print(f"{step}: the served model takes {ratio}x the in-process time")
    if args.out:
        write_results(args.out, figures, conditions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
