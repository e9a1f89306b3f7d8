"""The steps of bench/gpu_check.py, one group per process (``--group``).

Each step returns its figures or raises; :func:`run_step` times it and writes its outcome
to the results file before the next step starts. A step whose input another step makes
(``DEPENDS``) is skipped when that one did not pass. Sizes: ``--tiny`` is CI's (resnet10,
128 px, a few steps, on the CPU); otherwise resnet18 at 256 px on
demo data for the training and serving checks, and R50-FPN at 832x1344 for throughput.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_check import BENCH, GROUPS, REPO, lock_pins, record_step, update_results

DEPENDS = {
    "train_resume": "train_amp",
    "eval_parity": "train_amp",
    "export_onnx": "train_amp",
    "tensorrt": "export_onnx",
}
REQUIRED = {
    "torch": "torch",
    "torchvision": "torchvision",
    "numpy": "numpy",
    "pydantic": "pydantic",
    "google.protobuf": "protobuf",
    "PIL": "pillow",
    "pycocotools": "pycocotools",
    "faster_coco_eval": "faster-coco-eval",
    "tqdm": "tqdm",
    "torch.utils.tensorboard": "tensorboard",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "torch_pruning": "torch-pruning",
    "h5py": "h5py",
    "pytest": "pytest",
    "pytest_timeout": "pytest-timeout",
    "xdist": "pytest-xdist",
}
"""Module -> distribution: what maskops' engine and its GPU tests import."""
MIN_VERSIONS = {"torch": (2, 11), "torchvision": (0, 26)}
NOT_FOR_SERVING = ("torch.utils.tensorboard", "h5py", "pytest", "pytest_timeout", "xdist")
"""Modules of :data:`REQUIRED` that training, TAO's Keras import and the GPU tests need and
the serving step does not: a run of that step alone (``--groups environment
triton_serving``, its own carry) is not refused for them."""
SERVING_GROUPS = {"environment", "triton_serving"}
GROUPS_VARIABLE = "MASKOPS_GPU_CHECK_GROUPS"
"""The groups this run selected (comma-separated; unset: all), from bench/gpu_check.py."""


class StepSkipped(Exception):
    """The step cannot run here (no TensorRT, no time left); the message says why."""


class StepFailed(Exception):
    """A check did not hold; the message says which, and ``figures`` keeps what the step
    measured before it (recorded with the failure)."""

    def __init__(self, message: str, figures: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.figures = figures


def require(condition: bool, message: str, figures: dict[str, Any] | None = None) -> None:
    if not condition:
        raise StepFailed(message, figures)


@dataclass
class Context:
    out: Path
    work: Path
    device_name: str
    tiny: bool
    deadline: float
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device_name == "cuda"

    @property
    def device(self) -> Any:
        import torch

        return torch.device("cuda", 0) if self.cuda else torch.device("cpu")

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


# ---- 1. environment -------------------------------------------------------------------


def required_modules() -> dict[str, str]:
    """:data:`REQUIRED`, less :data:`NOT_FOR_SERVING` when the run is the serving step's."""
    groups = set(filter(None, os.environ.get(GROUPS_VARIABLE, "").split(",")))
    if groups and groups <= SERVING_GROUPS:
        return {m: d for m, d in REQUIRED.items() if m not in NOT_FOR_SERVING}
    return REQUIRED


def missing_packages() -> list[str]:
    """Each distribution whose module does not import, with the reason."""
    missing = []
    for module, dist in required_modules().items():
        try:
            importlib.import_module(module)
        except Exception as exc:  # an ImportError, or a broken install
            missing.append(f"{dist} ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    return missing


def too_old() -> list[str]:
    from importlib import metadata

    old = []
    for dist, floor in MIN_VERSIONS.items():
        version = metadata.version(dist)
        numbers = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
        if numbers < floor:
            old.append(f"{dist} {version} (maskops needs >= {'.'.join(map(str, floor))})")
    return old


def package_versions() -> dict[str, str | None]:
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for dist in sorted(set(REQUIRED.values())):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def tensorrt_version() -> dict[str, Any]:
    try:
        import tensorrt
    except Exception as exc:
        return {"installed": False, "reason": f"{type(exc).__name__}: {exc}"}
    return {"installed": True, "version": str(tensorrt.__version__)}


def step_environment(ctx: Context) -> dict[str, Any]:
    missing, old = missing_packages(), []
    if not any(m.startswith(("torch (", "torchvision (")) for m in missing):
        old = too_old()
    if missing or old:
        raise StepFailed(
            "maskops cannot run here: "
            + "; ".join([*(f"missing {m}" for m in missing), *old])
            + " (bench/gpu_check --prepare DIR where a registry is reachable, then "
            "bench/gpu_check --wheels DIR here)"
        )
    import onnxruntime
    import torch

    from maskops.device import cuda_report
    from maskops.training.trainer import cpu_has_native_bf16, cuda_bf16_native

    report = cuda_report()
    providers = onnxruntime.get_available_providers()
    figures: dict[str, Any] = {
        "python": sys.version.split()[0],
        "cuda": report.to_json(),
        "packages": package_versions(),
        "lock_torch": lock_pins().get("torch"),
        "onnxruntime": {
            "version": onnxruntime.__version__,
            "providers": providers,
            "cuda_provider": "CUDAExecutionProvider" in providers,
            "tensorrt_provider": "TensorrtExecutionProvider" in providers,
        },
        "tensorrt": tensorrt_version(),
    }
    if ctx.cuda:
        require(report.usable, f"no usable GPU: {report.summary()}")
        capability = torch.cuda.get_device_capability(0)
        figures.update(
            compute_capability=".".join(map(str, capability)),
            bf16_native=cuda_bf16_native(capability),
            torch_says_bf16_supported=torch.cuda.is_bf16_supported(),
            tf32={
                "cudnn_conv": torch.backends.cudnn.allow_tf32,
                "matmul": torch.backends.cuda.matmul.allow_tf32,
            },
        )
    else:
        figures["cpu_bf16_native"] = cpu_has_native_bf16()
    gpu = report.devices[0] if ctx.cuda and report.usable else None
    update_results(
        ctx.out,
        lambda doc: doc.update(
            gpu=gpu,
            driver=report.driver,
            torch=report.torch_version,
            cuda_build=report.cuda_build,
        ),
    )
    return figures


# ---- 2. the repository's GPU tests ------------------------------------------------------


CONTROL_PLANE = ("maskops_core", "maskops_api", "maskops_worker", "maskops_serve")
"""Packages whose dependencies (pydantic-settings, SQLAlchemy, Celery, FastAPI) the GPU host
has not: a GPU test of theirs runs where the whole stack is installed, not in this check."""


def gpu_test_files() -> list[str]:
    """The test files with ``gpu`` tests whose module imports the engine alone (pytest
    imports the module to collect it; imports inside a test run only with that test)."""
    top_level = re.compile(rf"^(from|import) ({'|'.join(CONTROL_PLANE)})\b", re.MULTILINE)
    files = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        text = path.read_text()
        if "mark.gpu" in text and not top_level.search(text):
            files.append(str(path.relative_to(REPO)))
    return files


def step_pytest_gpu(ctx: Context) -> dict[str, Any]:
    files = gpu_test_files()
    require(bool(files), "no test is marked gpu")
    timeout = max(10.0, ctx.remaining() - 5)
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q"]
    command += ["--timeout", "120", *files]
    try:
        done = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"pytest -m gpu did not finish in {timeout:.0f} s") from exc
    print(done.stdout[-4000:], done.stderr[-2000:], flush=True)
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    figures = {"files": files, "summary": summary, "counts": counts, "exit": done.returncode}
    require(done.returncode == 0, f"pytest -m gpu: {summary or done.stderr[-500:]}")
    if ctx.cuda:
        require(counts.get("passed", 0) > 0, f"no GPU test ran on the GPU: {summary}")
    return figures


# ---- 3. training ------------------------------------------------------------------------


def sizes(ctx: Context) -> dict[str, Any]:
    """Training sizes: steps of the first run, of the resumed one, image size, layers."""
    if ctx.tiny:
        return {"steps": 2, "resume_to": 4, "size": 128, "nlayers": 10, "batch": 2, "images": 12}
    return {"steps": 8, "resume_to": 12, "size": 256, "nlayers": 18, "batch": 4, "images": 60}


def demo_data(ctx: Context) -> Path:
    """Demo shapes converted to shards under ``work/data`` (made once, reused)."""
    from maskops.data.convert import convert_dataset
    from maskops.data.demo import generate_demo_dataset

    root = ctx.work / "data"
    done = root / "ready"
    if not done.exists():
        size = sizes(ctx)["size"]
        demo = generate_demo_dataset(
            root / "demo",
            num_images=sizes(ctx)["images"],
            image_size=(size, size),
            seed=0,
            val_fraction=0.25,
        )
        shards = root / "shards"
        convert_dataset(demo.train_images, demo.train_json, shards, workers=1)
        convert_dataset(demo.val_images, demo.val_json, shards, workers=1)
        done.write_text(str(demo.val_json))
    return root


def check_spec(ctx: Context, **overrides: Any) -> Any:
    """A small spec on the demo shards (tests/conftest.py's tiny_spec, scaled by ``sizes``):
    a warm-up, then a decay inside the resumed run's steps."""
    from synthetic import TINY_HEADS

    from maskops.spec.models import ExperimentSpec

    root, s = demo_data(ctx), sizes(ctx)
    spec: dict[str, Any] = {
        "seed": 7,
        "use_amp": True,
        "total_steps": s["steps"],
        "train_batch_size": s["batch"],
        "eval_batch_size": 4,
        "init_learning_rate": 0.004,
        "warmup_learning_rate": 0.0004,
        "warmup_steps": 2,
        "learning_rate_steps": [s["steps"] + 1],
        "learning_rate_decay_levels": [0.1],
        "num_steps_per_eval": s["steps"] if ctx.tiny else s["steps"] // 2,
        "save_checkpoints_steps": s["steps"] // 2,
        "data_config": {
            "image_size": (s["size"], s["size"]),
            "training_file_pattern": f"{root}/shards/train*",
            "validation_file_pattern": f"{root}/shards/val*",
            "val_json_file": (root / "ready").read_text(),
            "num_classes": 4,
            "n_workers": 0 if ctx.tiny else 2,
            "eval_samples": 4 if ctx.tiny else 0,
        },
        "maskrcnn_config": {
            "nlayers": s["nlayers"],
            **TINY_HEADS,
        },
    }
    for key in ("data_config", "maskrcnn_config"):
        spec[key].update(overrides.pop(key, {}))
    return ExperimentSpec.model_validate({**spec, **overrides})


def step_train_amp(ctx: Context) -> dict[str, Any]:
    import torch

    from maskops.checkpoints.run_directory import list_checkpoints
    from maskops.training import run_training
    from maskops.training.trainer import AmpSettings, DeviceTuning, cuda_bf16_native

    spec = check_spec(ctx)
    amp = AmpSettings.for_device(ctx.device, enabled=True)
    if ctx.cuda:
        native = cuda_bf16_native(torch.cuda.get_device_capability(0))
        require(amp.dtype == (torch.bfloat16 if native else torch.float16), f"AMP {amp}")
    shutil.rmtree(ctx.work / "train", ignore_errors=True)  # a rerun in the same --work
    result = run_training(spec, ctx.work / "train", log_every=1)
    steps = spec.total_steps
    require(result.step == steps, f"trained {result.step} of {steps} steps")
    require("mask_AP" in result.metrics, "no COCO evaluation inside training")
    require(math.isfinite(result.metrics["Total loss"]), "non-finite loss")
    saved = [step for step, _ in list_checkpoints(ctx.work / "train")]
    require(saved == [steps // 2, steps], f"checkpoints at steps {saved}")
    return {
        "amp": {"enabled": amp.enabled, "dtype": str(amp.dtype), "declined": amp.declined},
        "tuning": vars(DeviceTuning().resolve(ctx.device)),
        "steps": steps,
        "checkpoints": saved,
        "metrics": {k: result.metrics[k] for k in ("Total loss", "AP", "mask_AP")},
        "samples_per_sec": result.metrics.get("samples/sec"),
    }


def step_train_resume(ctx: Context) -> dict[str, Any]:
    from maskops.training import HookBase, run_training
    from maskops.training.schedule import LRSchedule

    class Probe(HookBase):
        def __init__(self) -> None:
            self.start = -1
            self.rates: list[tuple[int, float]] = []

        def before_train(self) -> None:
            self.start = self.trainer.iter

        def after_step(self) -> None:
            self.rates.append((self.trainer.iter, self.trainer.lr))

    first = check_spec(ctx)
    spec = check_spec(ctx, total_steps=sizes(ctx)["resume_to"])
    probe = Probe()
    result = run_training(spec, ctx.work / "train", extra_hooks=[probe], log_every=1)
    schedule = LRSchedule.from_spec(spec)
    expected = [
        (step, schedule(step - 1)) for step in range(first.total_steps + 1, 1 + spec.total_steps)
    ]
    require(probe.start == first.total_steps, f"resumed at step {probe.start}")
    require(result.step == spec.total_steps, f"ended at step {result.step}")
    require([s for s, _ in probe.rates] == [s for s, _ in expected], f"steps run {probe.rates}")
    for (step, lr), (_, want) in zip(probe.rates, expected, strict=True):
        require(math.isclose(lr, want, rel_tol=1e-9), f"step {step}: lr {lr}, schedule {want}")
    return {"resumed_at": probe.start, "learning_rates": probe.rates, "ended_at": result.step}


def step_train_fp16_scaler(ctx: Context) -> dict[str, Any]:
    """fp16 autocast (on a GPU), a GradScaler, clipping and accumulation in maskops'
    Trainer (run_training picks bf16 on a GPU that has it)."""
    import torch

    from maskops.data.pipeline import build_train_loader
    from maskops.training import HookBase
    from maskops.training.optim import build_optimizer
    from maskops.training.train import build_training_model
    from maskops.training.trainer import AmpSettings, Trainer

    class Norms(HookBase):
        """Each step's gradient norm before clipping (None: the scaler skipped it)."""

        def __init__(self) -> None:
            self.norms: list[float | None] = []

        def after_step(self) -> None:
            norm = self.trainer.last_grad_norm
            self.norms.append(None if norm is None else float(norm))

    spec = check_spec(ctx)
    model = build_training_model(spec, num_classes=spec.data_config.num_classes).to(ctx.device)
    seen: list[torch.dtype] = []
    first_conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    first_conv.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    before = next(model.parameters()).detach().clone()
    trainer = Trainer(
        model=model,
        optimizer=build_optimizer(model, lr=0.004, momentum=0.9, l2_weight_decay=1e-4),
        data=iter(build_train_loader(spec, pin_memory=ctx.cuda)),
        schedule=lambda step: 0.004,
        max_steps=sizes(ctx)["steps"],
        device=ctx.device,
        amp=AmpSettings(enabled=ctx.cuda, device_type=ctx.device.type, dtype=torch.float16),
        scaler=torch.amp.GradScaler(ctx.device.type),
        accumulate_grad_steps=2,
        clip_grad_norm=1.0,
    )
    probe = Norms()
    trainer.register_hooks([probe])
    trainer.train()
    assert trainer.scaler is not None
    applied = [n for n in probe.norms if n is not None]
    require(bool(applied), f"the scaler skipped all {len(probe.norms)} steps")
    norm, scale = applied[-1], trainer.scaler.get_scale()
    require(trainer.iter == trainer.max_steps, f"{trainer.iter} steps")
    require(not torch.equal(before, next(model.parameters()).detach()), "weights unchanged")
    require(all(math.isfinite(float(v)) for v in trainer.last_losses.values()), "loss")
    require(ctx.cuda == (torch.float16 in seen), f"first convolution computed in {set(seen)}")
    # Clipping sees unscaled gradients: scaled ones would be ``scale`` times larger.
    require(math.isfinite(norm) and (scale < 1e3 or norm < scale / 10), f"norm {norm}")
    return {
        "autocast": sorted(str(d) for d in set(seen)),
        "grad_norm_before_clip": norm,
        "grad_norms_before_clip": probe.norms,
        "loss_scale": scale,
        "skipped_steps": trainer.skipped_steps,
        "losses": {k: float(v) for k, v in trainer.last_losses.items()},
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def step_train_torchrun(ctx: Context) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from maskops.training.distributed import GroupTimeouts, RankInfo, init_process_group
    from maskops.training.launcher import RankPlan, train_under_torchrun

    spec = check_spec(ctx, total_steps=2, num_steps_per_eval=0, save_checkpoints_steps=0)
    shutil.rmtree(ctx.work / "torchrun", ignore_errors=True)
    result = train_under_torchrun(spec, ctx.work / "torchrun", RankPlan(nproc_per_node=1))
    require(result.step == 2, f"torchrun run ended at step {result.step}")
    # One rank forms no process group in a run: maskops' own set-up on this device's
    # backend (NCCL on a GPU) and an all-reduce check the collectives themselves.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    info = RankInfo(rank=0, world_size=1, local_rank=0, device=ctx.device)
    init_process_group(info, GroupTimeouts(init_s=60, collective_s=60))
    try:
        value = torch.full((4,), 3.0, device=ctx.device)
        dist.all_reduce(value)
        backend = str(dist.get_backend())
        require(float(value.sum()) == 12.0, f"all_reduce gave {value.tolist()}")
    finally:
        dist.destroy_process_group()
    return {"torchrun_steps": result.step, "process_group_backend": backend}


# ---- 4, 5. evaluation, inference and export ---------------------------------------------


@contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """cuDNN's TF32 convolutions (on by default in torch) on or off for a block."""
    import torch

    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = previous


def checkpoint_and_images(ctx: Context) -> tuple[Path, Any, list[Any]]:
    """The trained checkpoint, its spec and the validation images (resized and padded)."""
    from maskops.checkpoints.model_file import load_model
    from maskops.checkpoints.run_directory import latest_checkpoint
    from maskops.data.pipeline import build_eval_loader

    checkpoint = latest_checkpoint(ctx.work / "train")
    require(checkpoint is not None, "no checkpoint from train_amp")
    assert checkpoint is not None
    spec = check_spec(ctx)
    label_map = load_model(checkpoint).label_map
    loader = build_eval_loader(spec, label_map=label_map, with_masks=False)
    images = [image for batch, _ in loader for image in batch]
    return checkpoint, spec, images


def predict(model: Any, device: Any, images: list[Any], dtype: Any = None) -> list[Any]:
    from maskops.evaluation.predictor import TorchPredictor

    predictor = TorchPredictor(model, device=device, autocast_dtype=dtype)
    return [
        out for start in range(0, len(images), 4) for out in predictor(images[start : start + 4])
    ]


def coco_metrics(model: Any, device: Any, spec: Any, label_map: Any) -> dict[str, float]:
    from maskops.data.pipeline import build_eval_loader
    from maskops.evaluation.evaluator import COCOEvaluator
    from maskops.evaluation.predictor import TorchPredictor
    from maskops.evaluation.runner import evaluate_model

    evaluator = COCOEvaluator(spec.data_config.val_json_file, label_map)
    loader = build_eval_loader(spec, label_map=label_map, with_masks=False)
    metrics = evaluate_model(TorchPredictor(model, device=device), loader, evaluator)
    return {k: round(metrics[k], 5) for k in ("AP", "AP50", "mask_AP")}


def step_eval_parity(ctx: Context) -> dict[str, Any]:
    import torch

    from maskops.checkpoints.model_file import load_model
    from maskops.export.parity import TOLERANCES, compare_detections
    from maskops.training.trainer import AmpSettings

    checkpoint, spec, images = checkpoint_and_images(ctx)
    cpu = load_model(checkpoint)
    here = load_model(checkpoint, map_location=ctx.device)
    reference = predict(cpu.model, torch.device("cpu"), images)
    with tf32(False):
        strict = compare_detections(
            reference, predict(here.model, ctx.device, images), data_type="fp32"
        )
        gpu_metrics = coco_metrics(here.model, ctx.device, spec, here.label_map)
    cpu_metrics = coco_metrics(cpu.model, torch.device("cpu"), spec, cpu.label_map)
    figures: dict[str, Any] = {
        "images": len(images),
        "fp32_tf32_off": strict.to_json(),
        "metrics": {"cpu": cpu_metrics, ctx.device_name: gpu_metrics},
    }
    if ctx.cuda:  # what serving runs by default: TF32 convolutions, and AMP
        default = compare_detections(
            reference,
            predict(here.model, ctx.device, images),
            data_type="fp32",
            tolerances=TOLERANCES["fp16"],
        )
        amp = AmpSettings.for_device(ctx.device, enabled=True)
        autocast = compare_detections(
            reference, predict(here.model, ctx.device, images, amp.dtype), data_type="fp16"
        )
        figures.update(
            tf32_default_vs_fp16_bounds=default.to_json(), amp_vs_fp16_bounds=autocast.to_json()
        )
    require(strict.reference_detections > 0, "the checkpoint detects nothing: no parity shown")
    require(strict.passed, strict.summary())
    for key, value in cpu_metrics.items():
        require(
            abs(value - gpu_metrics[key]) <= 0.01,
            f"{key}: cpu {value}, {ctx.device_name} {gpu_metrics[key]}",
        )
    return figures


def step_export_onnx(ctx: Context) -> dict[str, Any]:
    from maskops.checkpoints.model_file import load_model
    from maskops.export.exporter import export_onnx
    from maskops.export.parity import compare_detections
    from maskops.export.predictor import OnnxPredictor

    checkpoint, spec, images = checkpoint_and_images(ctx)
    result = export_onnx(
        checkpoint, spec, ctx.work / "export" / "model.onnx", max_batch_size=4, log=print
    )
    ctx.state["onnx"] = result.onnx_path
    onnx_out = OnnxPredictor(result.onnx_path, providers=["CPUExecutionProvider"])(images)
    here = load_model(checkpoint, map_location=ctx.device)
    with tf32(False):
        eager = predict(here.model, ctx.device, images)
    parity = compare_detections(eager, onnx_out, data_type="fp32")
    require(parity.reference_detections > 0, "no detections to compare")
    require(parity.passed, f"onnxruntime vs {ctx.device_name}: {parity.summary()}")
    return {
        "export_parity_cpu": result.parity.to_json(),
        f"onnxruntime_vs_{ctx.device_name}": parity.to_json(),
        "export_seconds": round(result.seconds, 1),
    }


TENSORRT_ENGINES: tuple[tuple[str, int | None], ...] = (
    ("fp16", 4),
    ("fp16", None),
    ("int8", 4),
)
"""The engines the tensorrt step builds: (data type, static batch size; None: dynamic).
A static batch is the graph without a Loop; the dynamic one runs it inside a Loop."""


def engine_name(data_type: str, static_batch_size: int | None) -> str:
    """``fp16_static4``, ``fp16_dynamic``: an engine's name in the results."""
    batch = "dynamic" if static_batch_size is None else f"static{static_batch_size}"
    return f"{data_type}_{batch}"


def engine_check(ctx: Context, data_type: str, static_batch_size: int | None) -> dict[str, Any]:
    """Export with an engine, then compare the engine's detections with onnxruntime's on
    the ONNX it was built from; the figures, or the error, of that one engine."""
    from maskops.export.engine_predictor import engine_parity
    from maskops.export.exporter import export_onnx

    checkpoint, spec, images = checkpoint_and_images(ctx)
    out = ctx.work / "export" / f"model_{engine_name(data_type, static_batch_size)}.onnx"
    try:
        result = export_onnx(
            checkpoint,
            spec,
            out,
            data_type=data_type,
            max_batch_size=4,
            static_batch_size=static_batch_size,
            batches=2,
            batch_size=4,
            evaluate_int8=False,
            engine_file=out.with_suffix(".plan"),
            log=print,
        )
        if result.engine_file is None:
            return {"passed": False, "error": result.engine_note}
        parity = engine_parity(result.engine_file, out, images, data_type=data_type)
    except Exception as exc:  # one engine's failure must not hide the others'
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        return {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "passed": parity.passed and parity.reference_detections > 0,
        "engine_bytes": result.engine_file.stat().st_size,
        "onnx_parity": result.parity.to_json(),
        "engine_vs_onnxruntime": parity.to_json(),
    }


def step_tensorrt(ctx: Context) -> dict[str, Any]:
    from maskops.export.tensorrt import tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason()
    if reason is not None:
        raise StepSkipped(
            f"TensorRT not run ({reason}): no engine built, no engine-vs-onnxruntime parity"
        )
    engines = {}
    for data_type, static_batch_size in TENSORRT_ENGINES:
        engines[engine_name(data_type, static_batch_size)] = engine_check(
            ctx, data_type, static_batch_size
        )
    failed = [
        f"{name}: {e.get('error', 'engine vs onnxruntime differ')}"
        for name, e in engines.items()
        if not e["passed"]
    ]
    require(not failed, "; ".join(failed), {"engines": engines})
    return {"engines": engines}


# ---- 6. throughput ----------------------------------------------------------------------


def bench_train_in_process(
    ctx: Context, arms: list[str], batch: int = 1, coco: bool = False
) -> dict[str, Any]:
    """--tiny: bench/bench_train.py's arms, one round, in this process (its own runs start
    a process per arm; tests/unit/test_bench_scripts.py runs those)."""
    import bench_train
    import torch
    from synthetic import prepare_shards
    from timing import alternate

    args = argparse.Namespace(nlayers=10, image_size=[128, 128], batch=batch, steps=1, warmup=1)
    args.workers, args.device, args.threads = 0, "cpu", torch.get_num_threads()
    args.heads = "tiny"
    args.coco_shaped = coco
    root = ctx.work / f"bench_train_batch{batch}{'_coco' if coco else ''}"
    images = bench_train.train_images(args)
    prepare_shards(root, train_images=images, image_size=(128, 128), coco_shaped=coco)
    measures = [lambda arm=arm: bench_train.measure_arm(arm, root, args)[0] for arm in arms]
    spreads = dict(zip(arms, alternate(measures, rounds=1, warmup=0), strict=True))
    return {
        "config": {**vars(args), "rounds": 1},
        "amp": None,
        "arms": {arm: spreads[arm].summary("images_per_s") for arm in arms},
        "maskops_vs_torchvision": (
            {"fp32": bench_train.compare(spreads, "fp32")}
            if {"maskops-fp32", "torchvision-fp32"} <= set(arms)
            else {}
        ),
        "tuning_vs_default": bench_train.tuning_ratios(spreads),
    }


ARM_S_ESTIMATE = 30.0
"""Seconds one R50-FPN 832x1344 arm process of bench_train.py is taken to need on a GPU
(start, CUDA, 13 steps) until this run has timed one (``ctx.state["arm_s"]``). Measured on
an H100 (2026-11-27): 23 s an arm in ``throughput_train``, 25 s in ``throughput_tuning``;
a slower GPU takes longer."""
INFERENCE_S_ESTIMATE = 20.0
"""Seconds the inference throughput step is taken to need on a GPU (6 s on an H100,
2026-11-27)."""


def affordable_rounds(ctx: Context, arms: list[str], rounds: int) -> tuple[int, float]:
    """The most rounds of ``arms``, up to ``rounds``, that the time left affords (0: none),
    and the seconds an arm is taken to need."""
    arm_s = float(ctx.state.get("arm_s", ARM_S_ESTIMATE))
    return min(rounds, int((ctx.remaining() - 20) // (len(arms) * arm_s))), arm_s


TRAIN_STEPS, TRAIN_WARMUP, TRAIN_IMAGE_SIZE = 10, 3, (832, 1344)
"""Timed and untimed steps and the image size of each bench_train.py arm the full check
runs (R50-FPN at TAO's COCO size)."""


def bench_train(
    ctx: Context,
    arms: list[str],
    name: str,
    rounds: int = 2,
    batch: int = 4,
    coco: bool = False,
    data: Path | None = None,
) -> dict[str, Any]:
    """bench/bench_train.py's arms, ``batch`` images per step (``coco``: on COCO-shaped
    data, bench/synthetic.py; ``data``: a folder it prepared, reused), alternated in as
    many of ``rounds`` as the time left affords, in its own processes (the seconds one
    arm's process took go to ``ctx.state["arm_s"]``)."""
    if ctx.tiny:
        return bench_train_in_process(ctx, arms, batch=min(batch, 2), coco=coco)
    rounds, arm_s = affordable_rounds(ctx, arms, rounds)
    if rounds < 1:
        raise StepSkipped(f"{ctx.remaining():.0f} s left, about {arm_s:.0f} s an arm: too little")
    size = ["--nlayers", "50", "--image-size", *map(str, TRAIN_IMAGE_SIZE), "--batch", str(batch)]
    timing = ["--steps", str(TRAIN_STEPS), "--warmup", str(TRAIN_WARMUP), "--rounds", str(rounds)]
    out = ctx.work / f"{name}.json"
    started = time.monotonic()
    command = [sys.executable, str(BENCH / "bench_train.py"), "--device", ctx.device_name]
    command += [*size, *timing, "--workers", "4", "--arms", *arms, "--out", str(out)]
    command += ["--coco-shaped"] if coco else []
    command += ["--data", str(data)] if data is not None else []
    timeout = ctx.remaining() - 3
    try:
        done = subprocess.run(
            command, cwd=REPO, timeout=timeout, check=False, capture_output=True, text=True
        )
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"bench_train.py did not finish in {timeout:.0f} s") from exc
    print(done.stdout[-3000:], flush=True)
    require(done.returncode == 0, f"bench_train.py failed: {done.stderr[-1500:]}")
    doc: dict[str, Any] = json.loads(out.read_text())
    ctx.state["arm_s"] = (time.monotonic() - started) / (len(arms) * doc["config"]["rounds"])
    kept = ("config", "amp", "arms", "maskops_vs_torchvision", "tuning_vs_default", "failed_arms")
    return {k: doc[k] for k in kept if k in doc}


def tuning_arms(ctx: Context) -> tuple[str, list[str]]:
    """The precision of the throughput arms, and the variants to measure (on a CPU those
    that act there, to keep their paths alive: pinning, cuDNN and TF32 are CUDA's, the
    prefetcher passes batches through, and compiling on a CPU takes minutes)."""
    from bench_train import VARIANTS

    cpu = ["nopin", "fused", "u8", "prefetch", "compact", "nmsbatch"]
    return ("amp", list(VARIANTS)) if ctx.cuda else ("fp32", cpu)


def step_throughput_train(ctx: Context) -> dict[str, Any]:
    """maskops vs torchvision's loop; with --tiny the tuning arm runs in the same round."""
    precision, variants = tuning_arms(ctx)
    arms = [f"torchvision-{precision}", f"maskops-{precision}"]
    if ctx.tiny:
        arms += [f"maskops-{precision}-{v}" for v in variants]
    figures = bench_train(ctx, arms, "throughput_train")
    require(figures["maskops_vs_torchvision"][precision]["ratio"] > 0, "no ratio")
    ctx.state["throughput_train"] = figures
    return figures


TUNING_PRIORITY = (
    "graphs",
    "segnms",
    "compact",
    "compile",
    "tf32",
    "u8",
    "fused",
    "prefetch",
    "nmsbatch",
    "nopin",
    "nchw",
    "bench",
)
"""The switches ``throughput_tuning`` measures first when the time left affords a round of
some of them only: those not yet measured on a GPU (and any switch not listed here), then
those one H200 round found ahead or level (compact masks 1.08x, the compiled backbone
1.03x, TF32 1.00x, uint8 0.99x), then the losers, the defaults' own flips last (cuDNN
benchmark 0.11x)."""


def affordable_variants(ctx: Context, variants: list[str]) -> tuple[list[str], float]:
    """``variants`` in :data:`TUNING_PRIORITY` order, as many as one round beside the
    default arm fits in the time left, and the seconds an arm is taken to need."""
    rank = {name: index for index, name in enumerate(TUNING_PRIORITY)}
    ranked = sorted(variants, key=lambda name: rank.get(name, -1))  # a new switch first
    arm_s = float(ctx.state.get("arm_s", ARM_S_ESTIMATE))
    fits = int((ctx.remaining() - 20) // arm_s) - 1  # less the default arm
    return ranked[: max(fits, 0)], arm_s


def step_throughput_tuning(ctx: Context) -> dict[str, Any]:
    precision, variants = tuning_arms(ctx)
    if ctx.tiny and "throughput_train" in ctx.state:
        figures, measured_now = ctx.state["throughput_train"], variants
    else:
        measured_now, arm_s = affordable_variants(ctx, variants)
        if not measured_now:
            raise StepSkipped(
                f"{ctx.remaining():.0f} s left, about {arm_s:.0f} s an arm: too little for "
                "the default and one switch"
            )
        arms = [f"maskops-{precision}", *(f"maskops-{precision}-{v}" for v in measured_now)]
        figures = bench_train(ctx, arms, "throughput_tuning")
    failed = figures.get("failed_arms", {})
    measured = len(figures["tuning_vs_default"]) + len(failed)
    require(measured == len(measured_now), "a variant arm is missing", figures)
    kept = {"tuning_vs_default": figures["tuning_vs_default"], "arms": figures["arms"]}
    if failed:
        kept["failed_arms"] = failed
    left_out = [v for v in variants if v not in measured_now]
    if left_out:
        kept["not_measured"] = {"switches": left_out, "why": "the time left afforded no more"}
    return kept


BATCH_SWEEP = (4, 8, 16)
"""Images per GPU step that ``throughput_batch`` measures (--tiny: 2, the path kept alive)."""


def shared_coco_data(ctx: Context, batch: int) -> Path:
    """COCO-shaped data for every batch of the sweep, drawn once, for the largest: the
    sweep's 458 images drawn per batch cost as much again as the 261 of batch 16."""
    from synthetic import prepare_shards

    root = ctx.work / "throughput_batch_data"
    train_images = (TRAIN_STEPS + TRAIN_WARMUP) * batch
    prepare_shards(root, train_images=train_images, image_size=TRAIN_IMAGE_SIZE, coco_shaped=True)
    return root


def step_throughput_batch(ctx: Context) -> dict[str, Any]:
    """maskops' default arm at each batch of :data:`BATCH_SWEEP` on COCO-shaped data, one
    process each: images/s and peak memory (GPU memory on CUDA, the process's RSS on a CPU
    run of its own). A batch that fails (out of memory) is recorded with its error; the
    others run."""
    precision, _ = tuning_arms(ctx)
    arm = f"maskops-{precision}"
    batches: dict[str, Any] = {}
    data = None if ctx.tiny else shared_coco_data(ctx, max(BATCH_SWEEP))
    for batch in (2,) if ctx.tiny else BATCH_SWEEP:
        try:
            # --tiny: the demo's shapes (with the crowded 480x640 ones the step took 94 s on
            # a 2-core host at load 10; tests/unit/test_bench_scripts.py draws those).
            name, coco = f"throughput_batch{batch}", not ctx.tiny
            figures = bench_train(ctx, [arm], name, rounds=1, batch=batch, coco=coco, data=data)
        except StepFailed as exc:
            batches[str(batch)] = {"error": str(exc)[-500:]}
            continue
        row = figures["arms"][arm]
        keep = ("median_images_per_s", "peak_cuda_mb", "peak_rss_mb")
        batches[str(batch)] = {k: row[k] for k in keep if k in row}
    require(any("error" not in row for row in batches.values()), "no batch size trained", batches)
    return {"arm": arm, "batches": batches}


def step_throughput_inference(ctx: Context) -> dict[str, Any]:
    import torch
    from timing import alternate

    from maskops.evaluation.predictor import TorchPredictor
    from maskops.modeling import build_model
    from maskops.spec.models import MaskRCNNConfig
    from maskops.training.trainer import AmpSettings

    if not ctx.tiny and ctx.remaining() < INFERENCE_S_ESTIMATE:
        needed = f"about {INFERENCE_S_ESTIMATE:.0f} s needed"
        raise StepSkipped(f"{ctx.remaining():.0f} s left, {needed}")
    size, nlayers, batches, calls = (
        ((128, 128), 10, (1, 2), 1) if ctx.tiny else ((832, 1344), 50, (1, 8), 5)
    )
    torch.manual_seed(0)
    model = (
        build_model(MaskRCNNConfig(nlayers=nlayers), num_classes=4, image_size=size)
        .to(ctx.device)
        .eval()
    )
    amp = AmpSettings.for_device(ctx.device, enabled=True)
    precisions = {
        "fp32": None,
        **({str(amp.dtype).removeprefix("torch."): amp.dtype} if ctx.cuda else {}),
    }
    arms, measures = [], []
    for batch in batches:
        images = [torch.rand(3, *size) for _ in range(batch)]
        for name, dtype in precisions.items():
            predictor = TorchPredictor(model, device=ctx.device, autocast_dtype=dtype)

            def measure(predictor: Any = predictor, images: list[Any] = images) -> float:
                start = time.perf_counter()
                for _ in range(calls):
                    predictor(images)  # outputs come back to the host: a synchronisation
                return calls * len(images) / (time.perf_counter() - start)

            arms.append(f"batch_{batch}_{name}")
            measures.append(measure)
    spreads = alternate(measures, rounds=1 if ctx.tiny else 3, warmup=1)
    return {
        "model": f"resnet{nlayers}-FPN {size[0]}x{size[1]}, random weights, up to 100 detections",
        "images_per_s": {
            arm: s.summary("images_per_s", digits=2) for arm, s in zip(arms, spreads, strict=True)
        },
    }


PROFILE_S_ESTIMATE = 40.0
"""Seconds the training profile is taken to need on a GPU (demo data, the R50 model, nine
steps, the profile's summary): a guess until a GPU run times it."""


def step_train_profile(ctx: Context) -> dict[str, Any]:
    """bench/profile_train.py: where a training step's time goes, and how much of it the
    GPU computes (R50-FPN 832x1344, batch 4, AMP; five steps after three)."""
    import profile_train

    if ctx.tiny:
        sizes = {"nlayers": 10, "image_size": [128, 128], "batch": 1, "workers": 0, "amp": False}
        sizes["heads"] = "tiny"
        args = argparse.Namespace(**sizes, steps=1, warmup=1, device=ctx.device_name)
    else:
        if ctx.remaining() < PROFILE_S_ESTIMATE:
            needed = f"about {PROFILE_S_ESTIMATE:.0f} s needed"
            raise StepSkipped(f"{ctx.remaining():.0f} s left, {needed}")
        sizes = {"nlayers": 50, "image_size": [832, 1344], "batch": 4, "workers": 4, "amp": True}
        args = argparse.Namespace(**sizes, steps=5, warmup=3, device=ctx.device_name)
    figures = profile_train.profile_on_demo_data(args)
    require(figures["steps"] == args.steps and figures["step_ms"] > 0, "no step profiled")
    busy = figures["gpu_busy_fraction"]
    require(not ctx.cuda or 0 < busy <= 1.05, f"GPU busy fraction {busy}", figures)
    return {"config": vars(args), **figures}


SERVING_MARGIN_S = 15.0
"""Seconds the serving step keeps in hand after its last tuning arm (the step's checks,
recording, the server's stop)."""


def record_unfinished(out: Path, name: str, figures: dict[str, Any]) -> None:
    """Record step ``name`` as still running with the figures so far: should its process
    be killed at the group's time limit, bench/gpu_check.py keeps them with the failure."""
    record_step(out, name, {"status": "running", "seconds": 0.0, "figures": figures})


def step_serving_torch(ctx: Context) -> dict[str, Any]:
    """A checkpoint on the torch network backend in the real Triton (the
    nvidia-pytriton wheel's, which ``maskops serve`` runs), against in-process inference
    on the same device and precision (bench/gpu_serving.py)."""
    import importlib.util

    from gpu_serving import SERVED_ARMS, random_checkpoint, serving_check
    from synthetic import TINY_HEADS

    if importlib.util.find_spec("pytriton") is None:
        raise StepSkipped("no nvidia-pytriton: carry the serving wheels (--prepare-serving)")
    val = sorted((demo_data(ctx) / "demo").rglob("val/*.jpg"))
    require(bool(val), "no validation images in the demo data")
    size, nlayers = ((128, 128), 10) if ctx.tiny else ((832, 1344), 50)
    images = [path.read_bytes() for path in val[: 2 if ctx.tiny else 8]]
    work = ctx.work / "serving"
    # --tiny: CI's heads (TAO's 1024-wide box head made a 98 MB resnet10 that every
    # server and instance loads).
    heads = TINY_HEADS if ctx.tiny else None
    checkpoint = random_checkpoint(work / "model.pth", size=size, nlayers=nlayers, heads=heads)
    seconds, concurrency = (0.5, (1, 2)) if ctx.tiny else (10.0, (1, 8))
    figures = serving_check(
        checkpoint,
        images,
        device=ctx.device_name,
        work=work,
        seconds=seconds,
        concurrency=concurrency,
        # A tiny run exercises the instance counts once: processing_4 differs from
        # instances_2 only in the counts, and a CPU's two cores would run 9 processes.
        served_arms=("instances_2",) if ctx.tiny else tuple(SERVED_ARMS),
        time_left=lambda: ctx.remaining() - SERVING_MARGIN_S,
        progress=lambda so_far: record_unfinished(ctx.out, "serving_torch", so_far),
    )
    model = f"resnet{nlayers}-FPN {size[0]}x{size[1]}, random weights"
    figures = {"model": model + (", tiny heads" if ctx.tiny else ""), **figures}
    reports = figures["parity"].values()
    failed = [f"{r['data_type']}: {'; '.join(r['failures'])}" for r in reports if not r["passed"]]
    require(figures["passed"], f"served against in-process: {failed}", figures)
    return figures


STEPS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "environment": step_environment,
    "pytest_gpu": step_pytest_gpu,
    "train_amp": step_train_amp,
    "train_resume": step_train_resume,
    "train_fp16_scaler": step_train_fp16_scaler,
    "train_torchrun": step_train_torchrun,
    "eval_parity": step_eval_parity,
    "export_onnx": step_export_onnx,
    "tensorrt": step_tensorrt,
    "throughput_train": step_throughput_train,
    "throughput_inference": step_throughput_inference,
    "train_profile": step_train_profile,
    "throughput_tuning": step_throughput_tuning,
    "throughput_batch": step_throughput_batch,
    "serving_torch": step_serving_torch,
}


def run_step(name: str, ctx: Context) -> None:
    """Run one step and record its outcome (passed, failed with the error, or skipped)."""
    needs = DEPENDS.get(name)
    if needs is not None:
        status = json.loads(ctx.out.read_text())["steps"].get(needs, {}).get("status")
        if status != "passed":
            record_step(
                ctx.out,
                name,
                {
                    "status": "skipped",
                    "seconds": 0.0,
                    "note": f"needs {needs}, which {status or 'did not run'}",
                },
            )
            return
    print(f"[gpu_check] {name} ...", flush=True)
    started = time.monotonic()
    result: dict[str, Any]
    try:
        result = {"status": "passed", "figures": STEPS[name](ctx)}
    except StepSkipped as exc:
        result = {"status": "skipped", "note": str(exc)}
    except StepFailed as exc:
        result = {"status": "failed", "error": str(exc)}
        if exc.figures is not None:
            result["figures"] = exc.figures
    except Exception as exc:
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = round(time.monotonic() - started, 1)
    record_step(ctx.out, name, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", required=True, choices=[g.name for g in GROUPS])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], required=True)
    parser.add_argument("--deadline-s", type=float, required=True)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    ctx = Context(args.out, args.work, args.device, args.tiny, time.monotonic() + args.deadline_s)
    (group,) = (g for g in GROUPS if g.name == args.group)
    for name in group.steps:
        run_step(name, ctx)


if __name__ == "__main__":
    main()
