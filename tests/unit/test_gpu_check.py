"""bench/gpu_check on the CPU: every step a CPU can run passes, and nothing in its results
claims a GPU; a step group that overruns its time is recorded failed without losing the
steps before it; --prepare's wheel list is the lock's, without what a GPU host has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from tests.support.bench import BENCH, REPO, load_bench_module

gpu_check = load_bench_module("gpu_check")
readme_table = load_bench_module("readme_table")


def as_on_the_gpu_host() -> dict[str, str]:
    """Environment variables that leave a process of this environment only what a GPU host
    has after ``--prepare``'s wheels: the machine's packages (``MACHINE_HAS`` and what they
    need), the wheels, maskops' sources, and pytest with its two plugins; every other
    installed module is hidden (tests/support/import_guard)."""
    from importlib.metadata import packages_distributions

    allowed = gpu_check.runtime_closure(gpu_check.MACHINE_HAS, stop=())
    allowed |= gpu_check.wheels_wanted() | {"maskops", "pip"}

    def on_host(distribution: str) -> bool:
        name = gpu_check.normalize(distribution)
        return name in allowed or name.startswith(("nvidia-", "cuda-"))

    hidden = [
        module
        for module, distributions in packages_distributions().items()
        if module.isidentifier() and not any(on_host(d) for d in distributions)
    ]
    guard = str(REPO / "tests" / "support" / "import_guard")
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [guard, os.environ.get("PYTHONPATH")])),
        "MASKOPS_TEST_BLOCKED_MODULES": ",".join(sorted(hidden)),
        # The host has no other pytest plugin: none is loaded from this environment's.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTEST_PLUGINS": "pytest_timeout,xdist.plugin,xdist.looponfail",
    }


def test_the_tiny_cpu_check_passes_every_step_and_records_no_gpu(tmp_path: Path) -> None:
    """Run with only what the GPU host has: a test or step importing more fails here."""
    out = tmp_path / "gpu_check_cpu.json"
    command = [str(BENCH / "gpu_check"), "--device", "cpu", "--tiny", "--out", str(out)]
    command += ["--work", str(tmp_path / "work"), "--wheels", str(tmp_path / "no-wheels")]
    env = {**os.environ, "PYTHON": sys.executable, **as_on_the_gpu_host()}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    doc = json.loads(out.read_text())
    steps = doc["steps"]
    assert list(steps) == [step for group in gpu_check.GROUPS for step in group.steps]
    assert done.returncode == 0 and doc["passed"] and doc["complete"], done.stdout[-3000:]
    assert steps["tensorrt"]["status"] == "skipped"  # no TensorRT on a CPU, never faked
    assert "no engine built" in steps["tensorrt"]["note"]
    assert all(s["status"] == "passed" for n, s in steps.items() if n != "tensorrt")
    assert all(s["seconds"] >= 0 for s in steps.values())
    assert (tmp_path / "work").is_dir()  # a named scratch folder is kept
    # A CPU run names no GPU anywhere, and the README table would not take it.
    assert doc["device"] == "cpu" and doc["gpu"] is None and doc["machine"]["gpu"] is None
    assert steps["environment"]["figures"]["cuda"]["device_count"] == 0
    assert not readme_table.records_gpu(doc)
    figures = {name: step.get("figures", {}) for name, step in steps.items()}
    assert figures["train_resume"]["resumed_at"] == 2 and figures["train_resume"]["ended_at"] == 4
    assert figures["train_torchrun"]["process_group_backend"] == "gloo"
    assert figures["eval_parity"]["fp32_tf32_off"]["passed"]
    assert figures["throughput_train"]["maskops_vs_torchvision"]["fp32"]["ratio"] > 0
    tuned = set(figures["throughput_tuning"]["tuning_vs_default"])
    expected = ("nopin", "fused", "u8", "prefetch", "compact", "nmsbatch")
    assert tuned == {f"maskops-fp32-{v}" for v in expected}
    assert set(figures["throughput_batch"]["batches"]) == {"2"}
    assert all(
        row["median_images_per_s"] > 0 for row in figures["throughput_batch"]["batches"].values()
    )
    # Served through the real Triton: where each run's requests spent their time in it.
    served = figures["serving_torch"]["served"]
    # The served arms that act on a CPU ran (a failed arm is recorded, not raised).
    assert served["clients_2_instances_2"]["images_per_s"] > 0, served["clients_2_instances_2"]
    assert "clients_2_host_outputs" not in served  # CUDA only
    for run in (served["clients_1"], served["clients_2"]):
        parts = run["in_server"]
        assert set(parts) == {"ensemble", "preprocess", "net", "postprocess"}
        assert parts["ensemble"]["requests"] == run["calls"]
        assert 0 < parts["net"]["compute_infer_ms"] < parts["ensemble"]["total_ms"]
    profile = figures["train_profile"]
    assert profile["steps"] == 1 and profile["gpu_busy_fraction"] is None  # no GPU to be busy
    assert "aten::convolution_backward" in {name for name, _ in profile["top_cpu_ops"]}


def test_a_passing_run_removes_its_default_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default folder, in $TMPDIR (checkpoints and exports: 584 MB after a tiny run),
    would otherwise stay on every machine that ran the check; a named one stays (the tiny
    check's, above). The environment step alone passes."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    out, wheels = str(tmp_path / "results.json"), str(tmp_path / "none")
    argv = ["gpu_check", "--device", "cpu", "--tiny", "--groups", "environment", "--out", out]
    monkeypatch.setattr(sys, "argv", [*argv, "--wheels", wheels])
    args = gpu_check.parse_args()
    assert args.work.parent == scratch.resolve()
    assert gpu_check.run_checks(args) == 0
    # (The step's torch leaves its own caches in $TMPDIR.)
    assert not args.work.exists() and not list(scratch.glob("maskops-gpu-check-*"))


def test_a_run_that_skipped_every_step_fails_saying_nothing_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget too small for any step checks nothing: that is not a pass."""
    out = tmp_path / "results.json"
    argv = ["gpu_check", "--device", "cpu", "--tiny", "--budget-s", "0", "--out", str(out)]
    argv += ["--work", str(tmp_path / "work"), "--wheels", str(tmp_path / "none")]
    monkeypatch.setattr(sys, "argv", argv)
    assert gpu_check.run_checks(gpu_check.parse_args()) == 1
    doc = json.loads(out.read_text())
    assert {step["status"] for step in doc["steps"].values()} == {"skipped"}
    assert doc["complete"] and doc["passed"] is False and doc["failed_steps"] == []
    assert doc["nothing_ran"] == "no step passed: every step was skipped"


def test_a_group_past_its_time_is_recorded_failed_and_earlier_steps_stay(
    tmp_path: Path,
) -> None:
    out = tmp_path / "results.json"
    gpu_check.record_step(out, "environment", {"status": "passed", "seconds": 1.0})
    group = gpu_check.Group("training", ("train_amp", "train_resume"), 1, 1)
    args = Namespace(tiny=True, out=out, work=tmp_path, device="cpu")
    env = gpu_check.child_environment(None, device="cpu")
    started = time.monotonic()
    gpu_check.run_group(group, args, env, deadline=time.monotonic() + 60)
    assert time.monotonic() - started < 30  # killed at its cap, not left to finish
    steps = json.loads(out.read_text())["steps"]
    assert steps["environment"]["status"] == "passed"
    # The step it was running failed; the one it never started is skipped, saying why.
    assert steps["train_amp"]["status"] == "failed"
    assert "timed out after 1 s" in steps["train_amp"]["error"]
    assert steps["train_resume"]["status"] == "skipped"
    assert steps["train_resume"]["note"] == (
        "not started: the training process ended during train_amp (timed out after 1 s)"
    )
    assert json.loads(out.read_text())["passed"] is False


def test_a_step_killed_at_its_time_keeps_the_figures_it_recorded_so_far(tmp_path: Path) -> None:
    """As the serving step records its figures after each phase (``record_unfinished``)."""
    out = tmp_path / "results.json"
    steps = load_bench_module("gpu_check_steps")
    steps.record_unfinished(out, "serving_torch", {"parity": {"passed": True}})
    assert json.loads(out.read_text())["passed"]  # running is not failed
    group = gpu_check.Group("triton_serving", ("serving_torch",), 1, 1)
    args = Namespace(tiny=True, out=out, work=tmp_path, device="cpu")
    env = gpu_check.child_environment(None, device="cpu")
    gpu_check.run_group(group, args, env, deadline=time.monotonic() + 60)
    doc = json.loads(out.read_text())
    step = doc["steps"]["serving_torch"]
    assert step["status"] == "failed" and "timed out after 1 s" in step["error"]
    assert step["figures"] == {"parity": {"passed": True}}
    assert doc["passed"] is False and doc["failed_steps"] == ["serving_torch"]


def test_the_children_see_maskops_sources_and_a_cpu_run_sees_no_gpu(tmp_path: Path) -> None:
    cpu = gpu_check.child_environment(tmp_path, device="cpu")
    paths = cpu["PYTHONPATH"].split(os.pathsep)
    assert paths[0] == str(tmp_path) and paths[1] == str(REPO)
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and "MASKOPS_REQUIRE_CUDA" not in cpu
    assert gpu_check.child_environment(None, device="cuda")["MASKOPS_REQUIRE_CUDA"] == "1"


def test_prepare_takes_the_locks_versions_of_what_the_gpu_host_lacks() -> None:
    wanted = gpu_check.wheels_wanted()
    pins = gpu_check.lock_pins()
    assert {"pydantic", "protobuf", "pycocotools", "tensorboard", "pytest-timeout"} <= wanted
    assert not {"torch", "torchvision", "numpy", "onnx", "onnxruntime", "sympy", "scipy"} & wanted
    assert not [name for name in wanted if name.startswith("nvidia-")]
    assert all(name in pins for name in wanted), sorted(wanted - set(pins))


def test_throughput_steps_skip_what_the_time_left_cannot_afford(tmp_path: Path) -> None:
    """Rounds are cut to what the time left affords, at the seconds an arm took (a guess
    until one is timed); with none affordable the step is skipped, saying why, instead of
    being killed at the deadline and failing."""
    steps = load_bench_module("gpu_check_steps")
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"steps": {}}))

    def context(seconds_left: float) -> Any:
        return steps.Context(out, tmp_path, "cuda", False, time.monotonic() + seconds_left)

    arms = ["torchvision-amp", "maskops-amp"]
    guess = steps.ARM_S_ESTIMATE
    assert steps.affordable_rounds(context(20 + 4 * guess + 5), arms, 2) == (2, guess)
    assert steps.affordable_rounds(context(20 + 3 * guess), arms, 2) == (1, guess)
    assert steps.affordable_rounds(context(20 + guess), arms, 2) == (0, guess)
    timed = context(20 + 2 * 10.0 + 5)
    timed.state["arm_s"] = 10.0
    assert steps.affordable_rounds(timed, arms, 2) == (1, 10.0)
    # The switches: as many as one round affords beside the default arm, new ones first.
    variants = ["nopin", "compact", "segnms", "newswitch", "graphs"]
    assert steps.affordable_variants(timed, variants) == (["newswitch"], 10.0)  # 2 arms
    timed.deadline = time.monotonic() + 20 + 4 * 10.0 + 5
    three = ["newswitch", "graphs", "segnms"]
    assert steps.affordable_variants(timed, variants) == (three, 10.0)
    for name in ("throughput_train", "throughput_inference", "throughput_tuning"):
        steps.run_step(name, context(15))
        recorded = json.loads(out.read_text())["steps"][name]
        assert recorded["status"] == "skipped" and "s left, about" in recorded["note"]
        assert recorded["seconds"] < 5


def _pure_wheel(folder: Path, module: str) -> Path:
    """A minimal pure-Python wheel of one module."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{module}-1.0.dist-info"
    files = {
        f"{module}.py": "ANSWER = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    wheel = folder / f"{module}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def test_the_wheels_are_installed_only_under_the_python_they_are_for(
    tmp_path: Path, capsys
) -> None:
    """--prepare downloads for the GPU host's Python; another interpreter would fail to load
    their compiled parts, so it runs without them and says so."""
    wheels = tmp_path / "wheels"
    _pure_wheel(wheels, "gpu_check_probe")
    site = tmp_path / "site"
    assert gpu_check.wheel_site(wheels, "3.11", site) is None
    said = capsys.readouterr().out
    assert f"wheels in {wheels} not used: they are for Python 3.12, this is 3.11" in said
    assert not site.exists()
    assert gpu_check.wheel_site(wheels, gpu_check.TARGET_PYTHON, site) == site
    assert (site / "gpu_check_probe.py").read_text() == "ANSWER = 42\n"
    assert "installed in" in capsys.readouterr().out
    assert gpu_check.wheel_site(tmp_path / "none", gpu_check.TARGET_PYTHON, site) is None
    assert gpu_check.wheel_site(None, gpu_check.TARGET_PYTHON, site) is None


def test_a_failed_step_keeps_what_it_measured(tmp_path: Path, monkeypatch) -> None:
    """The tensorrt step records every engine, built or not, when one of them fails."""
    steps = load_bench_module("gpu_check_steps")
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"steps": {}}))

    def two_engines_one_failed(ctx: object) -> dict[str, object]:
        engines = {"fp16_static4": {"passed": True}, "fp16_dynamic": {"passed": False}}
        steps.require(False, "fp16_dynamic: the build failed", {"engines": engines})
        return {}

    monkeypatch.setitem(steps.STEPS, "engines_probe", two_engines_one_failed)
    ctx = steps.Context(out, tmp_path, "cpu", True, time.monotonic() + 60)
    steps.run_step("engines_probe", ctx)
    recorded = json.loads(out.read_text())["steps"]["engines_probe"]
    assert recorded["status"] == "failed" and "fp16_dynamic" in recorded["error"]
    assert recorded["figures"]["engines"]["fp16_static4"] == {"passed": True}


def test_the_serving_carry_is_the_slimmed_server_and_what_inference_imports() -> None:
    """The serving step's call carries all it needs on a fresh host: the server, and the
    engine's wheels less training's and AutoML's, within one carry with the checkout."""
    wanted = gpu_check.serving_wheels_wanted()
    assert {"nvidia-pytriton", "pydantic", "protobuf", "pycocotools", "pyyaml"} <= wanted
    assert not {"tensorboard", "sqlalchemy", "optuna", "pytest", "grpcio", "torch"} & wanted
    pins = gpu_check.lock_pins()
    assert all(name in pins for name in wanted), sorted(wanted - set(pins))


def test_the_server_wheel_keeps_the_target_pythons_stub_and_the_servers_libraries() -> None:
    from importlib.metadata import distribution

    names = [str(f) for f in distribution("nvidia-pytriton").files or []]
    kept = {n for n in names if gpu_check.server_wheel_keeps(n, "3.12")}
    stubs = "pytriton/tritonserver/python_backend_stubs/"
    assert f"{stubs}3.12/triton_python_backend_stub" in kept
    assert not [n for n in kept if n.startswith(stubs) and not n.startswith(f"{stubs}3.12/")]
    assert "pytriton/tritonserver/bin/tritonserver" in kept
    assert "pytriton/tritonserver/backends/python/libtriton_python.so" in kept
    libs = [n for n in names if n.startswith("nvidia_pytriton.libs/")]
    assert [n for n in libs if "libtritonserver" in n] and set(libs) - kept == {
        n for n in libs if n.startswith("nvidia_pytriton.libs/libpython3")
    }


def test_slimming_rewrites_the_wheel_and_its_record(tmp_path: Path) -> None:
    wheel = tmp_path / "nvidia_pytriton-0.7.0-py3-none-any.whl"
    members = {
        "pytriton/tritonserver/bin/tritonserver": b"server",
        "pytriton/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub": b"311",
        "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub": b"312",
        "nvidia_pytriton.libs/libpython3-abc.13.so.1.0": b"libpython",
        "nvidia_pytriton.libs/libtritonserver-abc.so": b"lib",
    }
    record = "".join(f"{name},sha256=x,1\n" for name in members)
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("nvidia_pytriton-0.7.0.dist-info/RECORD", record)
    gpu_check.slim_server_wheel(wheel, "3.12")
    with zipfile.ZipFile(wheel) as archive:
        left = set(archive.namelist())
        listed = {
            line.split(",")[0]
            for line in archive.read("nvidia_pytriton-0.7.0.dist-info/RECORD").decode().splitlines()
        }
    assert left == {
        "pytriton/tritonserver/bin/tritonserver",
        "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub",
        "nvidia_pytriton.libs/libtritonserver-abc.so",
        "nvidia_pytriton-0.7.0.dist-info/RECORD",
    }
    assert listed == left - {"nvidia_pytriton-0.7.0.dist-info/RECORD"}


def test_the_serving_steps_own_call_asks_only_for_what_it_imports(monkeypatch) -> None:
    """Its carry leaves out training's and the GPU tests' packages: its environment step
    must not refuse the run for them, while a whole run still needs them."""
    steps = load_bench_module("gpu_check_steps")
    monkeypatch.delenv(steps.GROUPS_VARIABLE, raising=False)
    assert steps.required_modules() == steps.REQUIRED
    monkeypatch.setenv(steps.GROUPS_VARIABLE, "environment,triton_serving")
    serving = steps.required_modules()
    assert "torch.utils.tensorboard" not in serving and "pytest" not in serving
    assert {"torch", "pycocotools", "pydantic", "google.protobuf"} <= set(serving)
    monkeypatch.setenv(steps.GROUPS_VARIABLE, "environment,training")
    assert steps.required_modules() == steps.REQUIRED
