"""TAO Toolkit pretrained ResNet backbones (Keras .hdf5) load into maskops' backbone.

The real NGC files cannot be downloaded here, so each test writes a Keras-layout HDF5 file
with h5py: TAO's layer names (nvidia_tao_tf1.core.templates.resnet_tf), Keras' HWIO kernels
and BatchNorm gamma/beta/moving_mean/moving_variance, random values from a fixed seed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from maskops.checkpoints.model_file import CheckpointError, read_checkpoint
from maskops.checkpoints.pretrained import load_weights_into
from maskops.cli.main import main as cli_main
from maskops.modeling import build_model
from maskops.modeling.tao_keras import block_index, torch_module_name
from maskops.spec.models import ExperimentSpec, MaskRCNNConfig
from maskops.spec.text import spec_to_text

IMAGE_SIZE = (128, 128)
KerasWeights = dict[str, dict[str, np.ndarray]]

_LAYOUT = {10: [1, 1, 1, 1], 18: [2, 2, 2, 2], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3]}


def _letters(index: int) -> str:
    """TAO's subblock_ids, as its templates compute it."""
    out, cur = "", index
    while cur >= 0:
        out = chr(ord("a") + cur % 26) + out
        cur = cur // 26 - 1
    return out


def tao_resnet_weights(depth: int, *, seed: int, use_bias: bool = False) -> KerasWeights:
    """TAO's ResNet-``depth`` Keras layers with random weights, plus a classifier head."""
    rng = np.random.default_rng(seed)
    weights: KerasWeights = {}

    def conv(name: str, size: int, cin: int, cout: int) -> None:
        weights[name] = {"kernel": rng.standard_normal((size, size, cin, cout), np.float32)}
        if use_bias:
            weights[name]["bias"] = rng.standard_normal(cout, np.float32)

    def bn(name: str, channels: int) -> None:
        weights[name] = {
            "gamma": rng.uniform(0.5, 1.5, channels).astype(np.float32),
            "beta": rng.standard_normal(channels, np.float32),
            "moving_mean": rng.standard_normal(channels, np.float32),
            "moving_variance": rng.uniform(0.5, 2.0, channels).astype(np.float32),
        }

    conv("conv1", 7, 3, 64)
    bn("bn_conv1", 64)
    bottleneck = depth >= 50
    cin = 64
    for stage, blocks in enumerate(_LAYOUT[depth], start=1):
        width = 64 * 2 ** (stage - 1)
        subblocks = [(1, width), (3, width), (1, 4 * width)] if bottleneck else [(3, width)] * 2
        for j in range(blocks):
            prefix = f"block_{stage}{_letters(j)}_"
            channels = cin
            for k, (size, filters) in enumerate(subblocks, start=1):
                conv(f"{prefix}conv_{k}", size, channels, filters)
                bn(f"{prefix}bn_{k}", filters)
                channels = filters
            if j == 0:  # TAO projects the first block's shortcut of every stage
                conv(f"{prefix}conv_shortcut", 1, cin, channels)
                bn(f"{prefix}bn_shortcut", channels)
            cin = channels
    weights["predictions"] = {
        "kernel": rng.standard_normal((cin, 10), np.float32),
        "bias": np.zeros(10, np.float32),
    }
    return weights


def write_keras_hdf5(path: Path, weights: KerasWeights, *, full_model: bool = True) -> Path:
    """Keras 2's HDF5 layout: ``model.save`` (``model_weights/`` + ``model_config``) or
    ``save_weights`` (layers at the root); ``<layer>/<layer>/<weight>:0`` datasets."""
    with h5py.File(path, "w") as f:
        root = f.create_group("model_weights") if full_model else f
        names = ["input_1", *weights, "activation_1"]  # weightless layers have empty groups
        root.attrs["layer_names"] = [n.encode() for n in names]
        for name in names:
            group = root.create_group(name)
            layer = weights.get(name, {})
            group.attrs["weight_names"] = [f"{name}/{w}:0".encode() for w in layer]
            for weight, value in layer.items():
                group.create_dataset(f"{name}/{weight}:0", data=value)
        if full_model:
            layers = [
                {"class_name": "BatchNormalization", "config": {"name": n, "epsilon": 1e-3}}
                for n in weights
                if "gamma" in weights[n]
            ]
            config = {"class_name": "Model", "config": {"name": "resnet", "layers": layers}}
            f.attrs["model_config"] = json.dumps(config).encode()
    return path


def _expected(weights: KerasWeights, layer: str, name: str) -> torch.Tensor:
    """What the torch tensor must hold: OIHW kernels, Keras eps 1e-3 folded into the var."""
    value = torch.from_numpy(weights[layer][name])
    if name == "kernel":
        return value.permute(3, 2, 0, 1)
    if name == "moving_variance":
        return value + (1e-3 - 1e-5)
    return value


def test_tao_names_map_to_torchvision_modules() -> None:
    assert [block_index(_letters(i)) for i in range(60)] == list(range(60))
    assert torch_module_name("conv1") == "conv1"
    assert torch_module_name("bn_conv1") == "bn1"
    assert torch_module_name("block_3w_conv_2") == "layer3.22.conv2"
    assert torch_module_name("block_1a_bn_3") == "layer1.0.bn3"
    assert torch_module_name("block_2a_conv_shortcut") == "layer2.0.downsample.0"
    assert torch_module_name("block_2a_bn_shortcut") == "layer2.0.downsample.1"
    assert torch_module_name("predictions") is None


@pytest.mark.parametrize("depth", [18, 50, 101])
def test_every_backbone_tensor_equals_the_keras_source(
    depth: int, tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    weights = tao_resnet_weights(depth, seed=depth)
    path = write_keras_hdf5(tmp_path / f"resnet_{depth}.hdf5", weights)
    model = build_model(tiny_config(nlayers=depth), num_classes=3, image_size=IMAGE_SIZE)
    report = load_weights_into(model, path)

    state = model.state_dict()
    body = {
        k for k in state if k.startswith("backbone.body.") and not k.endswith("num_batches_tracked")
    }
    assert set(report.loaded) == body
    assert not report.shape_mismatch
    assert not any(k.startswith("backbone.body.") for k in report.missing)
    torch_names = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean"}
    torch_names |= {"moving_variance": "running_var", "kernel": "weight"}
    for layer, layer_weights in weights.items():
        module = torch_module_name(layer)
        key_prefix = f"backbone.body.{module}."
        if module is None or f"{key_prefix}weight" not in state:
            continue
        for name in layer_weights:
            assert torch.equal(
                state[key_prefix + torch_names[name]], _expected(weights, layer, name)
            )

    not_loaded = {"predictions/kernel", "predictions/bias"}
    if depth == 18:
        # torchvision's BasicBlock keeps an identity shortcut in layer1.0; TAO projects it.
        not_loaded |= {
            "backbone.body.layer1.0.downsample.0.weight (block_1a_conv_shortcut/kernel)",
            "backbone.body.layer1.0.downsample.1.weight (block_1a_bn_shortcut/gamma)",
            "backbone.body.layer1.0.downsample.1.bias (block_1a_bn_shortcut/beta)",
            "backbone.body.layer1.0.downsample.1.running_mean (block_1a_bn_shortcut/moving_mean)",
            "backbone.body.layer1.0.downsample.1.running_var "
            "(block_1a_bn_shortcut/moving_variance)",
        }
    assert set(report.unexpected) == not_loaded
    assert any("epsilon" in note for note in report.notes)
    projected = [note for note in report.notes if "projects the shortcut" in note]
    if depth == 18:
        assert len(projected) == 1 and "of block_1a_conv_shortcut (1x1 conv)" in projected[0]
        # The trainer logs summary(): it carries what did not load and the notes.
        assert "(block_1a_conv_shortcut/kernel)" in report.summary()
        assert projected[0] in report.summary()
    else:
        assert not projected
    assert any("stride" in note for note in report.notes) == (depth >= 50)
    saved = json.loads(report.save(tmp_path / "report.json").read_text())
    assert saved["unexpected"] == report.unexpected and saved["loaded"] == report.loaded


def test_conv_bias_and_epsilon_fold_into_the_same_eval_output(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    weights = tao_resnet_weights(10, seed=3, use_bias=True)
    path = write_keras_hdf5(tmp_path / "resnet_10.h5", weights, full_model=False)
    model = build_model(tiny_config(nlayers=10), num_classes=3, image_size=IMAGE_SIZE)
    report = load_weights_into(model, path)
    assert any("biases folded" in note for note in report.notes)

    x = torch.randn(2, 3, 32, 32)
    conv, bn = weights["conv1"], weights["bn_conv1"]
    keras = F.batch_norm(  # Keras: BN(conv(x) + bias) with epsilon 1e-3
        F.conv2d(x, _expected(weights, "conv1", "kernel"), torch.from_numpy(conv["bias"]), 2, 3),
        torch.from_numpy(bn["moving_mean"]),
        torch.from_numpy(bn["moving_variance"]),
        torch.from_numpy(bn["gamma"]),
        torch.from_numpy(bn["beta"]),
        eps=1e-3,
    )
    body = model.backbone.body.eval()
    with torch.no_grad():
        ours = body.bn1(body.conv1(x))
    torch.testing.assert_close(ours, keras, rtol=1e-4, atol=1e-4)


def test_wrong_architecture_and_foreign_hdf5_fail_in_one_line(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    path = write_keras_hdf5(tmp_path / "resnet_50.hdf5", tao_resnet_weights(50, seed=0))
    model = build_model(tiny_config(nlayers=18), num_classes=3, image_size=IMAGE_SIZE)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_weights_into(model, path)
    message = str(info.value)
    assert "\n" not in message
    assert "a TAO ResNet-50 backbone, but the spec's model is ResNet-18" in message
    assert "set nlayers to 50" in message
    assert all(torch.equal(v, initial[k]) for k, v in model.state_dict().items())

    foreign = tmp_path / "other.h5"
    write_keras_hdf5(foreign, {"dense_1": {"kernel": np.ones((4, 2), np.float32)}})
    with pytest.raises(CheckpointError, match=r"other\.h5: an HDF5 file without TAO ResNet layers"):
        load_weights_into(model, foreign)
    encrypted = tmp_path / "resnet_18.tlt"
    encrypted.write_bytes(b"\x00encrypted")
    with pytest.raises(CheckpointError, match=r"resnet_18\.tlt: TAO's encrypted \.tlt models"):
        load_weights_into(model, encrypted)


def test_maskops_train_starts_from_a_tao_backbone(
    tmp_path: Path, tiny_spec: ExperimentSpec
) -> None:
    weights = tao_resnet_weights(10, seed=5)
    path = write_keras_hdf5(tmp_path / "resnet_10.hdf5", weights)
    spec = tiny_spec.model_copy(
        update={
            "total_steps": 1,
            "checkpoint": str(path),
            "data_config": tiny_spec.data_config.model_copy(update={"val_json_file": ""}),
            # The stem is frozen, so after a step it still holds the file's values.
            "maskrcnn_config": tiny_spec.maskrcnn_config.model_copy(update={"freeze_blocks": [0]}),
        }
    )
    spec_file = tmp_path / "spec.txt"
    spec_file.write_text(spec_to_text(spec))
    results = tmp_path / "results"
    assert cli_main(["train", "-e", str(spec_file), "-d", str(results)]) == 0

    state = read_checkpoint(results / "model.step-1.pth")["model"]
    assert torch.equal(state["backbone.body.conv1.weight"], _expected(weights, "conv1", "kernel"))
    for keras_name, torch_name in (("gamma", "weight"), ("moving_variance", "running_var")):
        assert torch.equal(
            state[f"backbone.body.bn1.{torch_name}"], _expected(weights, "bn_conv1", keras_name)
        )
