"""One command that proves maskops' training and serving paths on a GPU host, in minutes.

Steps, riskiest first, each timed, printed as it finishes and written to the results file at
once (a later crash or timeout keeps them; a failed step records its error and the steps
that do not need it still run):

1. ``environment``: ``maskops.device.cuda_report()``, whether bf16 is native on the GPU
   (compute capability >= 8.0), onnxruntime's providers, TensorRT and its version, the
   Python packages maskops needs (exactly which are missing), torch >= 2.11.
2. ``pytest_gpu``: the repository's ``@pytest.mark.gpu`` tests, with a time cap.
3. training on demo data (bench/gpu_check_steps.py): ``train_amp`` (the device's autocast,
   an evaluation inside training, checkpoints), ``train_resume`` (continues the step count
   and the learning-rate schedule), ``train_fp16_scaler`` (fp16 autocast, GradScaler,
   global-norm clipping after unscaling, gradient accumulation), ``train_torchrun`` (one
   rank through maskops' launcher, then maskops' process-group set-up on NCCL, or gloo on a
   CPU, and an all-reduce).
4. ``eval_parity``: evaluation and inference of one checkpoint on the GPU against the CPU:
   the same detections (``compare_detections``) and COCO metrics.
5. ``export_onnx`` (ONNX export, onnxruntime against the GPU's detections) and ``tensorrt``
   (where TensorRT is installed: fp16 engines of a static batch, without a Loop, and of a
   dynamic one, and an int8 engine of a static batch, each compared with onnxruntime and
   recorded on its own; where not, one line says so).
   ``serving_torch`` (bench/gpu_serving.py): the torch network backend in the real Triton
   (the nvidia-pytriton wheel's tritonserver, which ``maskops serve`` runs) on the device:
   served detections against in-process inference on the same device and precision,
   images/s with 1 and 8 HTTP clients and batch-1 p50/p99 latency against in-process
   eager inference, R50-FPN 832x1344; skipped without that wheel (``--prepare-serving``).
6. ``throughput_train`` (bench/bench_train.py: maskops vs torchvision's reference loop,
   R50-FPN 832x1344, AMP, arms alternated in rounds), ``throughput_inference`` (images/s
   at batch 1 and 8), ``train_profile`` (bench/profile_train.py: where a training step's
   time goes, how much of it the GPU computes, the host's waits for the device),
   ``throughput_tuning`` (pinned batches, cuDNN benchmark, channels_last, fused SGD, TF32
   matmuls, uint8 images, the prefetch stream, compact masks, the compiled backbone: each
   flipped from its default, against the default),
   ``throughput_batch`` (maskops' arm at 4, 8 and 16 images per step: images/s and peak
   GPU memory).

Each group of steps runs in a child process with a time limit; the whole run stays within
``--budget-s`` (8 minutes by default). On a host without maskops' dependencies, the
wheels a ``--prepare`` run downloaded are installed into a private folder (no network, no
Docker, nothing installed system-wide) and the services' folders go on ``PYTHONPATH``:

    bench/gpu_check --prepare .gpu-wheels       # here, with the package registry
    bench/gpu_check --prepare-serving .gpu-serving-wheels   # serving_torch's call, alone
    bench/gpu_check                             # there: writes gpu_check.json in bench/results/
    bench/gpu_check --device cpu --tiny --out /tmp/gpu_check_cpu.json   # CI, on a CPU

A CPU run never writes a GPU result: its file says ``"device": "cpu"`` and names no GPU,
and bench/readme_table.py shows only a file that records a GPU (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results" / "gpu_check.json"
WHEELS = REPO / ".gpu-wheels"
SITE = Path(os.environ.get("MASKOPS_GPU_CHECK_SITE", "/tmp/maskops-gpu-site"))
"""Where the carried wheels are installed (a fresh folder rehearses a fresh host)."""
SERVICES = ("core", "worker", "api")
BUDGET_S = 480.0
"""The whole check on one GPU: 8 minutes, so that one command fits a 10-minute limit."""
WHEELS_LIMIT_MB = 48.0
"""The wheels travel with the checkout, which may carry at most 64 MiB."""
MACHINE_HAS = (
    "torch",
    "torchvision",
    "triton",
    "onnx",
    "onnxruntime",
    "numpy",
    "ml-dtypes",
    "setuptools",
)
"""On the GPU host already (with the CUDA libraries, ``nvidia-*``; torch requires setuptools on
Python >= 3.12): never downloaded."""
NOT_NEEDED = ("scipy",)
"""In the engine's extra but used by nothing the check runs, and too large to carry: scipy is
AutoML's Gaussian-process sampler (imported only when a search builds one; 35 MiB)."""
TEST_ROOTS = ("pytest", "pytest-timeout", "pytest-xdist", "tritonclient[grpc]")
"""What ``pytest -m gpu`` needs beyond the engine: pyproject's addopts use pytest-timeout,
tests/conftest.py pytest-xdist's scheduler hook, the GPU serving tests parse Triton configs
with Triton's ModelConfig protobuf (``tritonclient.grpc``)."""
WHEEL_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
TARGET_PYTHON = "3.12"


@dataclass(frozen=True)
class Group:
    """Steps that run in one child process, one after another."""

    name: str
    steps: tuple[str, ...]
    cap_s: float
    """The most this group may take on a GPU (the budget may leave it less)."""
    tiny_cap_s: float
    needs_environment: bool = True


GROUPS = (
    Group("environment", ("environment",), 90, 60, needs_environment=False),
    Group("pytest_gpu", ("pytest_gpu",), 150, 120),
    Group(
        "training",
        ("train_amp", "train_resume", "train_fp16_scaler", "train_torchrun"),
        150,
        240,
    ),
    # Three TensorRT engine builds, where TensorRT is installed, take most of the 240 s.
    Group("serving", ("eval_parity", "export_onnx", "tensorrt"), 240, 180),
    # The torch backend in the real Triton: skipped without the tritonserver wheel, which
    # travels in a call of its own (SERVING_WHEEL), so it may take most of that call's
    # budget (118 s on an H200 before its tuning arms, which skip what the time left
    # cannot afford).
    Group("triton_serving", ("serving_torch",), 420, 300),
    Group(
        "throughput",
        # The batch sweep before the switches: larger batches are the lever the host's
        # pace leaves (the switches took 187 s of an H200's 400 s run, 2026-11-28).
        (
            "throughput_train",
            "throughput_batch",
            "train_profile",
            "throughput_inference",
            "throughput_tuning",
        ),
        BUDGET_S,
        360,
    ),
)
"""The tiny caps leave room for a shared machine: the tiny run took 38 s on 2 idle cores
and 229-414 s while other work kept the load average at 8-10."""


# ---- the results file: read, changed and replaced whole after every step -------------


def update_results(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to the results document and replace the file atomically."""
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"steps": {}}
    change(doc)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)


def record_step(path: Path, name: str, result: dict[str, Any]) -> None:
    """One step's outcome (``status`` passed | failed | skipped, ``seconds``, figures), or
    the figures of a step still running (``status`` running)."""

    def change(doc: dict[str, Any]) -> None:
        doc.setdefault("steps", {})[name] = result
        steps = doc["steps"].values()
        doc["failed_steps"] = [n for n, r in doc["steps"].items() if r["status"] == "failed"]
        doc["passed"] = all(r["status"] != "failed" for r in steps)

    update_results(path, change)
    if result["status"] == "running":
        print(f"[gpu_check] {name}: figures so far recorded", flush=True)
        return
    status = result["status"].upper()
    detail = result.get("error") or result.get("note") or ""
    print(
        f"[gpu_check] {name}: {status} in {result.get('seconds', 0):.1f} s"
        + (f" - {detail.splitlines()[0][:300]}" if detail else ""),
        flush=True,
    )


# ---- preparing the wheels (here) and installing them (on the GPU host) ---------------


def lock_pins(lock: Path = REPO / "requirements.lock") -> dict[str, str]:
    """``{normalized name: version}`` of requirements.lock."""
    pins = {}
    for line in lock.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[normalize(name.split("[")[0])] = version.strip()
    return pins


def normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def runtime_closure(roots: tuple[str, ...], *, stop: tuple[str, ...] = MACHINE_HAS) -> set[str]:
    """The distributions ``roots`` need at run time on the GPU host's Python, from this
    interpreter's installed metadata (markers evaluated for Linux, Python 3.12); ``stop``:
    distributions the host has, whose own requirements it has too."""
    from importlib import metadata

    from packaging.requirements import Requirement

    environment = {"python_version": TARGET_PYTHON, "python_full_version": f"{TARGET_PYTHON}.0"}
    seen: set[str] = set()
    visited: set[tuple[str, frozenset[str]]] = set()  # an extra may name another of its own
    todo = [Requirement(root) for root in roots]
    while todo:
        requirement = todo.pop()
        name = normalize(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in visited or name.startswith("nvidia-"):
            continue
        visited.add(key)
        seen.add(name)
        if name in stop:
            continue
        for text in metadata.requires(requirement.name) or []:
            child = Requirement(text)
            extras = requirement.extras or {""}
            marker = child.marker
            if marker is None or any(marker.evaluate({**environment, "extra": e}) for e in extras):
                todo.append(child)
    return seen


def wheels_wanted() -> set[str]:
    """What the engine and the GPU tests import that the GPU host lacks."""
    wanted = runtime_closure(("maskops[engine]", *TEST_ROOTS))
    return wanted - {"maskops", *MACHINE_HAS, *NOT_NEEDED}


SERVING_WHEEL = "nvidia-pytriton"
"""The ``serving_torch`` step's server: the tritonserver that ``maskops serve`` runs (53 MiB
as published, about 40 MiB slimmed by :func:`slim_server_wheel`)."""
SERVING_NOT_NEEDED = (
    "tensorboard",
    "tensorboard-data-server",
    "h5py",
    "sqlalchemy",
    "alembic",
    "mako",
    "optuna",
    "colorlog",
    "grpcio",
    "absl-py",
    "markdown",
    "werkzeug",
    "markupsafe",
)
"""In the engine's closure but imported by nothing the serving step runs (training's
TensorBoard writer, AutoML's study storage): left out so that the server and the rest of
the step's wheels fit one carry."""
SERVING_WHEELS_LIMIT_MB = 56.0
"""One carry of 64 MiB less the checkout (about 7.4 MiB, 2026-11-27)."""
SERVING_PLATFORMS = ("manylinux_2_35_x86_64", *WHEEL_PLATFORMS)
"""The tritonserver wheel is built for glibc 2.35 and later (Ubuntu 22.04 and later)."""


def serving_wheels_wanted() -> set[str]:
    """The serving step's carry: the server and what the engine's inference, the
    published ensemble and the demo data import that the GPU host lacks."""
    engine = runtime_closure(("maskops[engine]",))
    return {SERVING_WHEEL} | engine - {"maskops", *MACHINE_HAS, *NOT_NEEDED, *SERVING_NOT_NEEDED}


def prepare_serving(folder: Path) -> int:
    """Download the serving step's wheels into ``folder``, the server's slimmed, so that
    one call on a fresh GPU host carries all that step needs (the ``triton_serving``
    group, ``--groups environment triton_serving``)."""
    wanted = serving_wheels_wanted()
    code = prepare(folder, wanted=wanted, limit_mb=float("inf"), platforms=SERVING_PLATFORMS)
    if code:
        return code
    for wheel in folder.glob(f"{normalize(SERVING_WHEEL).replace('-', '_')}-*.whl"):
        before = wheel.stat().st_size
        slim_server_wheel(wheel)
        print(f"{wheel.name}: {before / 2**20:.1f} -> {wheel.stat().st_size / 2**20:.1f} MiB")
    return within_carry(folder, SERVING_WHEELS_LIMIT_MB)


def server_wheel_keeps(name: str, python: str = TARGET_PYTHON) -> bool:
    """Whether the server wheel's member ``name`` is needed on a host of ``python``: the
    python backend's stub for that Python alone, and none of the bundled ``libpython3``
    (linked by the 3.13 stub only; the others use the host's libpython)."""
    stubs = "pytriton/tritonserver/python_backend_stubs/"
    if name.startswith(stubs):
        return name.startswith(f"{stubs}{python}/")
    return not name.startswith("nvidia_pytriton.libs/libpython3")


def slim_server_wheel(wheel: Path, python: str = TARGET_PYTHON) -> None:
    """Rewrite ``wheel`` in place without the members :func:`server_wheel_keeps` drops,
    its RECORD listing only what is left."""
    slim = wheel.with_name(wheel.name + ".slim")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(slim, "w") as target:
        for info in source.infolist():
            if not server_wheel_keeps(info.filename, python):
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                kept = [line for line in lines if server_wheel_keeps(line.split(",")[0], python)]
                data = ("\n".join(kept) + "\n").encode()
            target.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    slim.replace(wheel)


def prepare(
    folder: Path,
    *,
    wanted: set[str] | None = None,
    limit_mb: float = 0.0,
    platforms: tuple[str, ...] = WHEEL_PLATFORMS,
) -> int:
    """Download the wheels the GPU host lacks (or ``wanted``) into ``folder``; print their
    total size."""
    pins = lock_pins()
    wanted = wheels_wanted() if wanted is None else wanted
    limit_mb = limit_mb or WHEELS_LIMIT_MB
    missing = sorted(name for name in wanted if name not in pins)
    if missing:
        print(f"not in requirements.lock: {', '.join(missing)}", file=sys.stderr)
        return 1
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps"]
    command += ["--python-version", TARGET_PYTHON, "--implementation", "cp"]
    command += ["--abi", f"cp{TARGET_PYTHON.replace('.', '')}", "-d", str(folder)]
    for platform in platforms:
        command += ["--platform", platform]
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([*command, *(f"{n}=={pins[n]}" for n in sorted(wanted))], check=True)
    return within_carry(folder, limit_mb)


def within_carry(folder: Path, limit_mb: float) -> int:
    """Say how many wheels ``folder`` holds and their size; 1, saying so, past ``limit_mb``."""
    wheels = sorted(folder.glob("*.whl"))
    size_mb = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size_mb:.1f} MiB in {folder}")
    if size_mb > limit_mb:
        print(f"too large to carry: more than {limit_mb} MiB", file=sys.stderr)
        return 1
    return 0


def install_wheels(folder: Path, site: Path = SITE) -> Path:
    """``pip install --no-index --no-deps --target site folder/*.whl`` (once per set of
    wheels); ``site`` goes first on the children's PYTHONPATH."""
    wheels = sorted(folder.glob("*.whl"))
    stamp = site / ".installed"
    names = "\n".join(w.name for w in wheels)
    if stamp.exists() and stamp.read_text() == names:
        return site
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet"]
    try:
        subprocess.run([*command, "--target", str(site), *map(str, wheels)], check=True)
    except subprocess.CalledProcessError as exc:
        # A Python without pip: a wheel is a zip of what its install puts in site-packages
        # (none of these has scripts or data to place elsewhere).
        print(f"[gpu_check] pip failed ({exc}): unpacking the wheels instead", flush=True)
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(site)
    stamp.write_text(names)
    return site


def wheel_site(folder: Path | None, python: str, site: Path = SITE) -> Path | None:
    """``folder``'s wheels installed in ``site`` under the Python they are for
    (:data:`TARGET_PYTHON`), or None: no wheels, or another ``python`` (``major.minor``),
    whose interpreter would not load their compiled parts, which it says."""
    if folder is None or not any(folder.glob("*.whl")):
        return None
    if python != TARGET_PYTHON:
        print(
            f"[gpu_check] wheels in {folder} not used: they are for Python "
            f"{TARGET_PYTHON}, this is {python}",
            flush=True,
        )
        return None
    install_wheels(folder, site)
    print(f"[gpu_check] wheels from {folder} installed in {site}", flush=True)
    return site


def child_environment(site: Path | None, *, device: str) -> dict[str, str]:
    """The children's environment: the private site and maskops' source folders first on
    PYTHONPATH (nothing installed); on a CPU run no GPU is visible, on a GPU run one is
    required (maskops.device fails rather than train on the CPU)."""
    paths = [str(site)] if site else []
    paths += [str(REPO), *(str(REPO / "services" / s) for s in SERVICES)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.pop("MASKOPS_REQUIRE_CUDA", None)
    else:
        env["MASKOPS_REQUIRE_CUDA"] = "1"
    return env


# ---- running the groups ----------------------------------------------------------------


def run_group(group: Group, args: argparse.Namespace, env: dict[str, str], deadline: float) -> None:
    """Run ``group`` in a child (which records each of its steps). Of the steps it left
    unrecorded or still running (a crash, the time limit), the one it was running is
    recorded failed, with the figures it recorded so far, and those it never started
    skipped."""
    cap = group.tiny_cap_s if args.tiny else group.cap_s
    timeout = max(1.0, min(cap, deadline - time.monotonic()))
    command = [sys.executable, str(BENCH / "gpu_check_steps.py"), "--group", group.name]
    command += ["--out", str(args.out), "--work", str(args.work), "--device", args.device]
    command += ["--deadline-s", f"{timeout:.0f}"] + (["--tiny"] if args.tiny else [])
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True)
    try:
        returncode: int | str = process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the child and what it started
        process.wait()
        returncode = f"timed out after {timeout:.0f} s"
    recorded = json.loads(args.out.read_text())["steps"]
    status = {step: recorded.get(step, {}).get("status", "running") for step in group.steps}
    unfinished = [step for step in group.steps if status[step] == "running"]
    if not unfinished:
        return
    running, *never_started = unfinished
    why = returncode if isinstance(returncode, str) else f"exit status {returncode}"
    error = f"the {group.name} process ended before this step finished ({why})"
    seconds = round(time.monotonic() - started, 1)
    failed = {"status": "failed", "seconds": seconds, "error": error}
    so_far = recorded.get(running, {}).get("figures")
    record_step(args.out, running, failed | ({"figures": so_far} if so_far else {}))
    for step in never_started:
        note = f"not started: the {group.name} process ended during {running} ({why})"
        record_step(args.out, step, {"status": "skipped", "seconds": 0.0, "note": note})


def skip_group(group: Group, out: Path, why: str) -> None:
    for step in group.steps:
        record_step(out, step, {"status": "skipped", "seconds": 0.0, "note": why})


def start_results(args: argparse.Namespace) -> Any:
    """A fresh results file naming the run; the machine record comes from bench/machine.py
    (its GPU fields from the environment step)."""
    sys.path.insert(0, str(BENCH))
    try:
        from machine import start_run  # imports torch

        conditions: Any = start_run()
    except Exception as exc:  # the environment step says what is missing
        print(f"[gpu_check] no machine record: {exc}", flush=True)
        conditions = f"{type(exc).__name__}: {exc}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not args.groups:  # a rerun of some groups keeps the other steps' results
        args.out.unlink(missing_ok=True)

    def change(doc: dict[str, Any]) -> None:
        doc.update(
            check="gpu_check",
            date=datetime.now(UTC).isoformat(timespec="seconds"),
            device=args.device,
            tiny=args.tiny,
            budget_s=args.budget_s,
            gpu=None,
            complete=False,
        )

    update_results(args.out, change)
    return conditions


def finish_results(args: argparse.Namespace, conditions: Any, seconds: float) -> bool:
    """Close the results file: the machine and load record (bench/machine.py), or why
    there is none; the run's time."""
    if isinstance(conditions, str):
        record: dict[str, Any] = {"machine": None, "machine_not_recorded": conditions}
        record["load_not_recorded"] = conditions
    else:
        record = conditions.record()
        if args.device == "cpu":
            record["machine"]["gpu"] = None  # the GPU of this host was hidden from the run

    def change(doc: dict[str, Any]) -> None:
        doc.update(record, complete=True, seconds=round(seconds, 1))
        # A run whose every step was skipped (a budget too small, the environment failed
        # before) checked nothing: it fails rather than reading as a pass.
        if not any(step["status"] == "passed" for step in doc["steps"].values()):
            doc.update(passed=False, nothing_ran="no step passed: every step was skipped")

    update_results(args.out, change)
    doc = json.loads(args.out.read_text())
    verdict = "PASSED" if doc["passed"] else "FAILED"
    print(
        f"[gpu_check] {verdict} in {seconds:.0f} s: {args.out}"
        + (f" ({doc['nothing_ran']})" if "nothing_ran" in doc else "")
    )
    return bool(doc["passed"])


def run_checks(args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = started + args.budget_s
    site = wheel_site(args.wheels, f"{sys.version_info.major}.{sys.version_info.minor}")
    env = child_environment(site, device=args.device)
    if args.groups:  # the environment step asks only for what they need
        env["MASKOPS_GPU_CHECK_GROUPS"] = ",".join(args.groups)
    args.work.mkdir(parents=True, exist_ok=True)
    conditions = start_results(args)
    for group in GROUPS:
        if args.groups and group.name not in args.groups:
            continue
        steps = json.loads(args.out.read_text())["steps"]
        environment = steps.get("environment", {}).get("status", "passed")  # not run: try
        if group.needs_environment and environment != "passed":
            skip_group(group, args.out, "needs the environment step, which failed")
        elif deadline - time.monotonic() < 5:
            skip_group(group, args.out, f"the {args.budget_s:.0f} s budget is spent")
        else:
            run_group(group, args, env, deadline)
    passed = finish_results(args, conditions, time.monotonic() - started)
    if passed and args.work_is_default:
        # Checkpoints and exports of several hundred MB: kept only where named or needed
        # to read a failure.
        shutil.rmtree(args.work, ignore_errors=True)
    return 0 if passed else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny model and data (CI)")
    parser.add_argument("--out", type=Path, help=f"results file (default {RESULTS})")
    parser.add_argument(
        "--work",
        type=Path,
        help="scratch folder, kept (default: one in $TMPDIR, removed after a passing run)",
    )
    parser.add_argument("--budget-s", type=float, help=f"default {BUDGET_S:g} (--tiny: 900)")
    parser.add_argument(
        "--groups",
        nargs="+",
        choices=[g.name for g in GROUPS],
        help="run only these groups, keeping the results file's other steps",
    )
    parser.add_argument(
        "--wheels", type=Path, help=f"wheels of a --prepare run (default {WHEELS}, if present)"
    )
    parser.add_argument("--prepare", type=Path, metavar="DIR", help="download wheels, exit")
    parser.add_argument(
        "--prepare-serving",
        type=Path,
        metavar="DIR",
        help="download the triton_serving group's wheels (the server's slimmed), exit",
    )
    args = parser.parse_args()
    if args.out is None:
        args.out = RESULTS if args.device == "cuda" else RESULTS.with_name("gpu_check_cpu.json")
    args.out = args.out.resolve()
    if args.budget_s is None:
        args.budget_s = 900.0 if args.tiny else BUDGET_S
    if args.wheels is None and WHEELS.is_dir():
        args.wheels = WHEELS
    args.work_is_default = args.work is None
    default_work = Path(tempfile.gettempdir()) / f"maskops-gpu-check-{os.getpid()}"
    args.work = (args.work or default_work).resolve()
    return args


def main() -> int:
    args = parse_args()
    if args.prepare is not None:
        return prepare(args.prepare)
    if args.prepare_serving is not None:
        return prepare_serving(args.prepare_serving)
    return run_checks(args)


if __name__ == "__main__":
    sys.exit(main())
