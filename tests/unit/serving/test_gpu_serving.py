"""GPU serving as publish writes it: the network's config.pbtxt for each device and backend,
read back with Triton's own ModelConfig protobuf; the TensorRT engine checks that fail a
publish before anything is written or loaded; the python network model's device choice."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from maskops.cli.main import main as cli_main
from maskops.serving import EnsembleNames, PublishError, existing_versions, publish
from maskops.serving.engines import TRITON_TENSORRT_VERSION, record_path, same_tensorrt
from maskops.serving.placement import ENGINE_CACHE_ROOT, Placement, parse_gpus
from tests.support.fake_export import fake_engine, fake_onnx_export

NAMES = EnsembleNames("m")
KIND_GPU = model_config_pb2.ModelInstanceGroup.Kind.KIND_GPU
KIND_CPU = model_config_pb2.ModelInstanceGroup.Kind.KIND_CPU


def _config(repo: Path, model: str) -> model_config_pb2.ModelConfig:
    text = (repo / model / "config.pbtxt").read_text()
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _accelerator(config: model_config_pb2.ModelConfig) -> tuple[str, dict[str, str]]:
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    return accelerator.name, dict(accelerator.parameters)


def _tree(repo: Path) -> list[str]:
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*")) if repo.exists() else []


@pytest.mark.parametrize(
    ("data_type", "precision"), [("fp32", "FP32"), ("fp16", "FP16"), ("int8", "INT8")]
)
def test_gpu_default_is_onnxruntime_with_the_tensorrt_accelerator(tmp_path, data_type, precision):
    export = fake_onnx_export(tmp_path / "m.onnx", "batch", data_type=data_type)
    repo = tmp_path / "repo"
    publish(export, repo, "m", placement=Placement("gpu", (0, 1)))
    net = _config(repo, NAMES.net)
    assert net.platform == "onnxruntime_onnx" and net.max_batch_size == 3
    (group,) = net.instance_group
    assert group.kind == KIND_GPU and list(group.gpus) == [0, 1] and group.count == 1
    name, params = _accelerator(net)
    assert name == "tensorrt"
    assert params["precision_mode"] == precision
    # No explicit profile: onnxruntime would need one for every dynamic input of every
    # TensorRT subgraph of a partitioned graph (Mask R-CNN's is).
    assert not [key for key in params if key.startswith("trt_profile")]
    # One cache folder per version, in the Triton process's own cache root.
    assert params["trt_engine_cache_enable"] == "1"
    assert params["trt_engine_cache_path"] == f"{ENGINE_CACHE_ROOT}/{NAMES.net}.1"
    assert sorted(p.name for p in (repo / NAMES.net / "1").iterdir()) == [
        "model.onnx",
        "settings.json",
    ]
    for part in (NAMES.preprocess, NAMES.postprocess):
        assert [g.kind for g in _config(repo, part).instance_group] == [KIND_CPU]
    history = json.loads((repo / "m" / "versions.json").read_text())
    assert history[-1]["net_backend"] == "onnxruntime" and history[-1]["device"] == "gpu"


def test_a_portable_int8_export_is_refused_for_the_tensorrt_accelerator(tmp_path):
    """TensorRT imports only symmetric int8 Q/DQ: the portable int8 export (uint8
    activations, asymmetric ranges) would fail when Triton builds the engine, so publish
    refuses it for GPU serving and names the fix. The CPU takes it; the GPU takes the
    symmetric form (target tensorrt)."""
    portable = fake_onnx_export(tmp_path / "p.onnx", "batch", data_type="int8", zero_point=131)
    repo = tmp_path / "repo"
    with pytest.raises(PublishError, match="export it again with target tensorrt") as refused:
        publish(portable, repo, "m", placement=Placement("gpu"))
    assert "zero point 'zero' is UINT8" in str(refused.value)
    assert _tree(repo) == []
    assert publish(portable, repo, "m") == 1
    symmetric = fake_onnx_export(tmp_path / "s.onnx", "batch", data_type="int8", zero_point=0)
    assert publish(symmetric, repo, "m", placement=Placement("gpu")) == 2


def test_each_version_has_its_own_engine_cache_under_the_given_root(tmp_path):
    """onnxruntime names an engine after the graph's structure, not its weights: two
    versions of one network would share one cache file in one folder."""
    export = fake_onnx_export(tmp_path / "m.onnx", "batch")
    repo = tmp_path / "repo"
    for _ in range(2):
        publish(export, repo, "m", placement=Placement("gpu"), engine_cache_root="/srv/trt/")
    net = _config(repo, NAMES.net)
    _, params = _accelerator(net)
    assert params["trt_engine_cache_path"] == f"/srv/trt/{NAMES.net}.2"
    # Every GPU Triton sees: no gpus field.
    assert list(net.instance_group[0].gpus) == []


def test_cpu_hosts_keep_the_python_backend_on_the_cpu(tmp_path):
    export = fake_onnx_export(tmp_path / "m.onnx", "batch")
    repo = tmp_path / "repo"
    publish(export, repo, "m")
    net = _config(repo, NAMES.net)
    assert net.backend == "python" and not net.HasField("optimization")
    assert [g.kind for g in net.instance_group] == [KIND_CPU]
    # Triton's onnxruntime backend on a CPU host: KIND_CPU and no TensorRT.
    publish(export, repo, "m", net_backend="onnxruntime")
    net = _config(repo, NAMES.net)
    assert net.platform == "onnxruntime_onnx" and not net.HasField("optimization")
    assert [g.kind for g in net.instance_group] == [KIND_CPU]


def test_python_network_on_gpus(tmp_path):
    export = fake_onnx_export(tmp_path / "m.onnx", "batch")
    repo = tmp_path / "repo"
    publish(export, repo, "m", net_backend="python", placement=Placement("gpu", (1,)), instances=2)
    net = _config(repo, NAMES.net)
    assert net.backend == "python" and not net.HasField("optimization")
    (group,) = net.instance_group
    assert (group.kind, list(group.gpus), group.count) == (KIND_GPU, [1], 2)


def test_tensorrt_plan_on_gpus(tmp_path):
    export = fake_onnx_export(tmp_path / "m.onnx", "batch")
    fake_engine(export, tensorrt_version="10.7.0")
    repo = tmp_path / "repo"
    publish(export, repo, "m", net_backend="tensorrt", placement=Placement("gpu", (0,)))
    net = _config(repo, NAMES.net)
    assert net.platform == "tensorrt_plan" and not net.HasField("optimization")
    assert [(g.kind, list(g.gpus)) for g in net.instance_group] == [(KIND_GPU, [0])]
    history = json.loads((repo / "m" / "versions.json").read_text())
    assert history[-1]["engine"] == str(export.with_suffix(".engine"))


def test_a_batch_1_engine_serves_one_image_per_run(tmp_path):
    """A static batch of 1 (the Loop-free graph DeepStream runs) as Triton's TensorRT plan:
    Triton batches nothing, and refuses a static batch of more (it cannot fill one). The
    GPU's default backend, onnxruntime, refuses it: Triton would not load it."""
    export = fake_onnx_export(tmp_path / "m.onnx", 1, max_batch_size=1)
    fake_engine(export, profile=(1, 1, 1))
    repo = tmp_path / "repo"
    gpu = Placement("gpu", (0,))
    publish(export, repo, "m", net_backend="tensorrt", placement=gpu, max_batch_size=4)
    net = _config(repo, NAMES.net)
    assert (net.platform, net.max_batch_size) == ("tensorrt_plan", 1)
    with pytest.raises(PublishError, match="onnxruntime backend batches a dynamic batch only"):
        publish(export, repo, "m", placement=gpu)
    four = fake_onnx_export(tmp_path / "four.onnx", 4, max_batch_size=4)
    fake_engine(four, profile=(4, 4, 4))
    with pytest.raises(PublishError, match="batch of 4: Triton's tensorrt backend runs batch 1"):
        publish(four, repo, "four", net_backend="tensorrt", placement=gpu)


def test_tensorrt_publishes_fail_before_writing_anything(tmp_path):
    export = fake_onnx_export(tmp_path / "m.onnx", "batch")
    repo = tmp_path / "repo"
    publish(export, repo, "m")
    before = _tree(repo)
    gpu = Placement("gpu")

    def refused(match: str, **options: Any) -> None:
        with pytest.raises(PublishError, match=match):
            publish(export, repo, "m", net_backend="tensorrt", **options)
        assert _tree(repo) == before

    refused("runs on GPUs only")
    refused(
        r"m.engine: no such TensorRT engine file \(looked for the engine next to the ONNX\)",
        placement=gpu,
    )
    engine = fake_engine(export, tensorrt_version="10.8.0.1")
    refused(
        r"built by TensorRT 10.8.0.1 but Triton runs TensorRT 10.7.0.23: a TensorRT engine "
        "loads only in the version that built it",
        placement=gpu,
    )
    # The operator's Triton runs that TensorRT: accepted.
    publish(
        export, repo, "m", net_backend="tensorrt", placement=gpu, triton_tensorrt_version="10.8.0"
    )
    before = _tree(repo)
    # A build that died between the engine and its record: a new engine, the old record.
    record = record_path(engine).read_text()
    fake_engine(export, tensorrt_version="10.7.0.23")
    engine.write_bytes(b"a plan whose record was never written")
    refused("is not the engine its record describes", placement=gpu)
    record_path(engine).write_text(record.replace('"engine_sha256"', '"sha"'))
    refused(r"unreadable engine record \(KeyError: 'engine_sha256'\); rebuild", placement=gpu)
    record_path(engine).unlink()
    refused("no record of the TensorRT version that built it", placement=gpu)
    fake_engine(export, profile=(1, 2, 2))
    refused(r"profile serves batches 1..2, Triton batches 1..3", placement=gpu)
    publish(export, repo, "m", net_backend="tensorrt", placement=gpu, max_batch_size=2)
    before = _tree(repo)
    other = fake_onnx_export(tmp_path / "other.onnx", "batch", data_type="fp32")
    refused("was not built from", placement=gpu, engine=fake_engine(other))
    assert existing_versions(repo, "m") == [1, 2, 3]


def test_the_publish_command_says_why_before_contacting_triton(tmp_path, capsys):
    export = fake_onnx_export(tmp_path / "m.onnx", "batch")
    fake_engine(export, tensorrt_version="10.3.0.26")
    args = ["publish", "-m", str(export), "-n", "m", "--repository", str(tmp_path / "r")]
    # No Triton listens on port 9: a publish that got as far as loading would say so.
    gpu = [*args, "--device", "gpu", "--net_backend", "tensorrt", "--triton_url", "127.0.0.1:9"]
    assert cli_main(gpu) == 2
    assert (
        "built by TensorRT 10.3.0.26 but Triton runs TensorRT 10.7.0.23" in capsys.readouterr().err
    )
    assert not (tmp_path / "r").exists()
    assert cli_main([*args, "--device", "cpu", "--gpus", "0"]) == 2
    assert "GPUs given for the CPU device" in capsys.readouterr().err
    assert cli_main([*args, "--device", "gpu", "--gpus", "1,3"]) == 0
    net = _config(tmp_path / "r", NAMES.net)
    assert (net.instance_group[0].kind, list(net.instance_group[0].gpus)) == (KIND_GPU, [1, 3])
    assert _accelerator(net)[1]["trt_engine_cache_path"] == f"{ENGINE_CACHE_ROOT}/{NAMES.net}.1"
    assert cli_main([*args, "--device", "gpu", "--triton_engine_cache", "/srv/trt"]) == 0
    net = _config(tmp_path / "r", NAMES.net)
    assert _accelerator(net)[1]["trt_engine_cache_path"] == f"/srv/trt/{NAMES.net}.2"


def test_tensorrt_versions_match_on_the_release():
    assert same_tensorrt("10.7.0", TRITON_TENSORRT_VERSION)
    assert same_tensorrt("10.7.0.23", "10.7.0.23")
    assert not same_tensorrt("10.7.0.23", "10.7.0.24")
    assert not same_tensorrt("10.8.0.43", "10.7.0.23")
    assert not same_tensorrt("10.7", "10.7.0.23")  # too vague to trust
    assert same_tensorrt("10.7.0.post1", "10.7.0.23")  # a pip package's suffix
    assert parse_gpus("0, 2") == (0, 2) and parse_gpus("") == ()


def test_settings_choose_gpu_serving_from_the_environment(monkeypatch):
    from maskops_core.settings import Settings

    assert Settings().triton_device == "cpu" and Settings().triton_net_backend == "auto"
    monkeypatch.setenv("MASKOPS_TRITON_DEVICE", "gpu")
    monkeypatch.setenv("MASKOPS_TRITON_GPUS", "[0, 2]")
    settings = Settings()
    assert settings.triton_device == "gpu" and settings.triton_gpus == [0, 2]
    monkeypatch.setenv("MASKOPS_TRITON_DEVICE", "cpu")
    with pytest.raises(ValueError, match="GPU ids given but triton_device is not gpu"):
        Settings()


def _network_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The published network model.py, with a stand-in for Triton's stub module that
    records what it logs."""
    export = fake_onnx_export(tmp_path / "m.onnx", "batch", data_type="fp32")
    repo = tmp_path / "repo"
    publish(export, repo, "m", net_backend="python", placement=Placement("gpu"))
    logged: list[str] = []
    stub = types.ModuleType("triton_python_backend_utils")
    stub.Logger = types.SimpleNamespace(  # type: ignore[attr-defined]
        log_info=lambda m: logged.append(f"info: {m}"),
        log_warn=lambda m: logged.append(f"warn: {m}"),
    )
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("net_model", repo / NAMES.net / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.logged = logged  # type: ignore[attr-defined]
    module.repo = repo  # type: ignore[attr-defined]
    return module


def _args(repo: Path, kind: str, device: str = "0") -> dict[str, str]:
    return {
        "model_repository": str(repo / NAMES.net),
        "model_version": "1",
        "model_name": NAMES.net,
        "model_instance_name": f"{NAMES.net}_0",
        "model_instance_kind": kind,
        "model_instance_device_id": device,
    }


def test_the_python_network_picks_cuda_only_for_gpu_instances(tmp_path, monkeypatch):
    model = _network_module(tmp_path, monkeypatch)
    both = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    gpu = _args(model.repo, "GPU", "1")
    assert model.session_providers(gpu, both) == [
        ("CUDAExecutionProvider", {"device_id": 1}),
        "CPUExecutionProvider",
    ]
    assert model.session_providers(_args(model.repo, "CPU"), both) == ["CPUExecutionProvider"]
    assert model.session_providers(gpu, ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has CUDA"
)
def test_a_gpu_instance_without_cuda_runs_on_the_cpu_and_says_so(tmp_path, monkeypatch):
    model = _network_module(tmp_path, monkeypatch)
    instance = model.TritonPythonModel()
    instance.initialize(_args(model.repo, "GPU"))
    assert instance.session.get_providers() == ["CPUExecutionProvider"]
    (line,) = model.logged
    assert line.startswith("warn: ") and "GPU instance runs on the CPU" in line
    assert "has no CUDA provider" in line


@pytest.mark.gpu
def test_a_gpu_instance_runs_on_cuda(tmp_path, monkeypatch):
    """Needs a CUDA GPU and onnxruntime-gpu (the triton-gpu / worker-gpu extras)."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime is the CPU build (install the triton-gpu extra)")
    model = _network_module(tmp_path, monkeypatch)
    instance = model.TritonPythonModel()
    instance.initialize(_args(model.repo, "GPU"))
    assert instance.session.get_providers()[0] == "CUDAExecutionProvider"
    assert model.logged and model.logged[0].startswith("info: ")
