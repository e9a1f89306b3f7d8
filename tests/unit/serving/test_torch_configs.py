"""The torch network backend's configs, read back with Triton's own ModelConfig protobuf:
a python-backend network on the placement's device, dynamically batched, whose
``parameters`` name backend, device and precision (what ``GET /models/{name}`` reports);
every net backend's config records them."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from maskops.export.graph import read_metadata
from maskops.serving import EnsembleNames, render_configs
from maskops.serving.model_configs import InstanceCounts
from maskops.serving.placement import Placement
from maskops.serving.protocol import NET_PARAMETERS
from tests.support.fake_export import fake_onnx_export


def _net(configs: dict[str, str]) -> model_config_pb2.ModelConfig:
    text = configs[EnsembleNames("m").net]
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _reported(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {ours: config.parameters[key].string_value for key, ours in NET_PARAMETERS.items()}


@pytest.fixture
def meta(tmp_path: Path):
    return read_metadata(fake_onnx_export(tmp_path / "m.onnx", "N", data_type="fp16"))


def test_the_torch_network_is_a_batched_python_model_on_its_device(meta) -> None:
    names = EnsembleNames("m")
    gpu = Placement("gpu", (1,))
    config = _net(render_configs(names, meta, net_backend="torch", placement=gpu, precision="bf16"))
    assert config.backend == "python" and config.max_batch_size == meta.max_batch_size
    assert config.HasField("dynamic_batching")
    (group,) = config.instance_group
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU and list(group.gpus) == [1]
    assert _reported(config) == {"net_backend": "torch", "device": "gpu", "precision": "bf16"}


@pytest.mark.parametrize("backend", ["python", "onnxruntime"])
def test_every_net_backend_records_where_it_runs(meta, backend: str) -> None:
    config = _net(render_configs(EnsembleNames("m"), meta, net_backend=backend))  # type: ignore[arg-type]
    assert _reported(config) == {"net_backend": backend, "device": "cpu", "precision": "fp16"}


def test_the_ensemble_carries_encoded_bytes_as_uint8(meta) -> None:
    names = EnsembleNames("m")
    configs = render_configs(names, meta, net_backend="torch")
    ensemble = text_format.Parse(configs[names.name], model_config_pb2.ModelConfig())
    preprocess = text_format.Parse(configs[names.preprocess], model_config_pb2.ModelConfig())
    uint8 = model_config_pb2.DataType.TYPE_UINT8
    image = ensemble.input[0]
    assert (image.name, image.data_type, list(image.dims)) == ("image_bytes", uint8, [-1])
    assert [(t.data_type, list(t.dims)) for t in ensemble.output] == [(uint8, [-1])]
    assert preprocess.input[0].allow_ragged_batch


@pytest.mark.parametrize(
    ("backend", "image_type"),
    [("torch", "TYPE_UINT8"), ("python", "TYPE_FP32"), ("onnxruntime", "TYPE_FP32")],
)
def test_the_image_is_handed_to_the_network_in_the_type_it_takes(
    meta, backend: str, image_type: str
) -> None:
    """The torch network takes uint8 pixels and divides them on its device; an exported
    graph takes floats. The preprocess model writes what its config says."""
    names = EnsembleNames("m")
    configs = render_configs(names, meta, net_backend=backend)  # type: ignore[arg-type]
    preprocess = text_format.Parse(configs[names.preprocess], model_config_pb2.ModelConfig())
    wanted = model_config_pb2.DataType.Value(image_type)
    [image_out] = [t for t in preprocess.output if t.name == "images"]
    assert image_out.data_type == wanted
    assert [t.data_type for t in _net(configs).input if t.name == "images"] == [wanted]


def test_the_processing_models_batch_without_waiting_and_the_network_waits(meta) -> None:
    """A lone client's request goes through preprocess and postprocess at once; only the
    network, whose batch runs as one, waits to fill it."""
    names = EnsembleNames("m")
    configs = render_configs(names, meta, net_backend="torch", max_queue_delay_us=1500)
    for model in (names.preprocess, names.postprocess):
        config = text_format.Parse(configs[model], model_config_pb2.ModelConfig())
        assert config.HasField("dynamic_batching")
        assert config.dynamic_batching.max_queue_delay_microseconds == 0
    assert _net(configs).dynamic_batching.max_queue_delay_microseconds == 1500


def test_the_network_and_the_processing_models_take_their_own_instance_counts(meta) -> None:
    names = EnsembleNames("m")
    counts = InstanceCounts(network=2, processing=3)
    configs = render_configs(names, meta, net_backend="torch", instances=counts)
    read = {m: text_format.Parse(c, model_config_pb2.ModelConfig()) for m, c in configs.items()}
    assert [g.count for g in read[names.net].instance_group] == [2]
    for model in (names.preprocess, names.postprocess):
        (group,) = read[model].instance_group
        assert (group.kind, group.count) == (model_config_pb2.ModelInstanceGroup.KIND_CPU, 3)
