"""TAO Toolkit's pretrained ResNet backbones (Keras ``.hdf5``) as torchvision ResNet weights.

TAO builds the Mask R-CNN backbone, and the ResNets of its pretrained_instance_segmentation /
pretrained_object_detection models, with ``nvidia_tao_tf1.core.templates.resnet_tf.ResNet``
(``use_batch_norm=True``, ``use_pooling=True``, ``all_projections=False``). Its Keras layers:

* stem: ``conv1`` (7x7/2) and ``bn_conv1``;
* block ``j`` (``a``, ``b``, ... as TAO's ``subblock_ids``) of stage ``s`` (1..4):
  ``block_{s}{j}_conv_{k}`` / ``block_{s}{j}_bn_{k}`` (k = 1..2 for BasicBlock ResNet-10/18/34,
  1..3 for Bottleneck ResNet-50/101), and on the first block of each stage the projection
  ``block_{s}a_conv_shortcut`` / ``block_{s}a_bn_shortcut``.

They map one to one onto torchvision's ``conv1``/``bn1``, ``layer{s}.{j}.conv{k}``/``bn{k}``
and ``layer{s}.{j}.downsample.0``/``.1``. A Keras HDF5 file (``model.save``: layers under
``model_weights/``; ``save_weights``: at the root) holds ``<layer>/<layer>/kernel:0`` and
friends. Conversions:

* ``kernel`` ``[kh, kw, in, out]`` (HWIO, whatever the model's data_format) -> ``weight``
  ``[out, in, kh, kw]`` (OIHW);
* BatchNorm ``gamma, beta, moving_mean, moving_variance`` -> ``weight, bias, running_mean,
  running_var`` (``[C]`` each);
* a conv ``bias`` (``use_bias=True`` models) is folded into the following BatchNorm's
  running mean (``BN(conv(x) + b)`` is ``BN'(conv(x))`` with ``mean' = mean - b``; in
  training mode the batch mean absorbs it anyway);
* Keras' BatchNorm epsilon (``model_config`` when the file has it, else Keras' 1e-3) is
  folded into the running variance, so the eval-mode output is the same with torch's eps.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .backbone import _RESNET_LAYOUT

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
KERAS_BN_EPSILON = 1e-3
"""``keras.layers.BatchNormalization``'s default epsilon, which TAO's ResNet template keeps."""

_BLOCK_LAYER = re.compile(r"^block_(\d+)([a-z]+)_(conv|bn)_(\d+|shortcut)$")
_BN_NAMES = {
    "gamma": "weight",
    "beta": "bias",
    "moving_mean": "running_mean",
    "moving_variance": "running_var",
}


class TaoWeightsError(ValueError):
    """The file is not a TAO Keras ResNet backbone this converter can read."""


@dataclass
class TaoBackbone:
    """A TAO Keras ResNet, converted."""

    state_dict: dict[str, Tensor]
    """torchvision ResNet names (``layer1.0.conv1.weight``, ...): conv weights
    ``[out, in, kh, kw]`` float32, BatchNorm vectors ``[C]``."""
    source_names: dict[str, str]
    """``state_dict`` key -> the Keras weight it came from (``block_1a_conv_1/kernel``)."""
    stage_blocks: tuple[int, ...]
    """Blocks per stage found in the file (``(2, 2, 2, 2)`` for ResNet-18)."""
    bottleneck: bool
    """Bottleneck blocks (a ``conv_3`` per block): ResNet-50/101."""
    ignored: list[str] = field(default_factory=list)
    """Keras weights with no torchvision counterpart (classifier heads, other layers)."""
    notes: list[str] = field(default_factory=list)
    """What the conversion folded or changed, one sentence each."""

    @property
    def depth(self) -> int | None:
        """10, 18, 34, 50 or 101 when the blocks match one of maskops' ResNets, else None."""
        return resnet_depth(self.stage_blocks, bottleneck=self.bottleneck)


def matching_depths(stage_blocks: tuple[int, ...], *, bottleneck: bool) -> list[int]:
    """maskops' ResNet depths whose first ``len(stage_blocks)`` stages have these blocks."""
    n = len(stage_blocks)
    return [
        depth
        for depth, (block, layers) in _RESNET_LAYOUT.items()
        if (block.expansion == 4) == bottleneck and tuple(layers[:n]) == tuple(stage_blocks)
    ]


def resnet_depth(stage_blocks: tuple[int, ...], *, bottleneck: bool) -> int | None:
    """The ResNet depth with these blocks in all four stages, or None."""
    depths = matching_depths(stage_blocks, bottleneck=bottleneck) if len(stage_blocks) == 4 else []
    return depths[0] if len(depths) == 1 else None


def is_hdf5(path: str | os.PathLike[str]) -> bool:
    """Whether the file starts with the HDF5 signature (Keras ``.hdf5``/``.h5``)."""
    try:
        with Path(path).open("rb") as fh:
            return fh.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
    except OSError:
        return False


def block_index(letters: str) -> int:
    """Inverse of TAO's ``subblock_ids``: ``a`` -> 0, ``z`` -> 25, ``aa`` -> 26."""
    index = 0
    for ch in letters:
        index = index * 26 + (ord(ch) - ord("a") + 1)
    return index - 1


def torch_module_name(keras_layer: str) -> str | None:
    """The torchvision ResNet module a TAO Keras layer maps to, or None."""
    if keras_layer == "conv1":
        return "conv1"
    if keras_layer == "bn_conv1":
        return "bn1"
    match = _BLOCK_LAYER.match(keras_layer)
    if match is None:
        return None
    stage, letters, kind, which = match.groups()
    prefix = f"layer{stage}.{block_index(letters)}"
    if which == "shortcut":
        return f"{prefix}.downsample.{0 if kind == 'conv' else 1}"
    return f"{prefix}.{kind}{which}"


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _layer_configs(model_config: Any) -> dict[str, dict[str, Any]]:
    """Layer name -> Keras layer config, from a ``model.save`` file's ``model_config``."""
    if model_config is None:
        return {}
    try:
        config = json.loads(_text(model_config))
    except ValueError:
        return {}
    configs: dict[str, dict[str, Any]] = {}
    stack = [config]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            inner = node.get("config")
            if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                configs.setdefault(inner["name"], inner)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return configs


def read_keras_weights(
    path: str | os.PathLike[str],
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, Any]]]:
    """Every layer's weights in a Keras HDF5 file.

    Returns:
        ``({layer: {"kernel": array, "gamma": array, ...}}, {layer: keras config})``; the
        weight names lose their ``<layer>/`` prefix and ``:0`` suffix. The configs are empty
        for a ``save_weights`` file.
    """
    import h5py

    layers: dict[str, dict[str, np.ndarray]] = {}
    with h5py.File(path, "r") as f:
        root = f.get("model_weights", f)
        configs = _layer_configs(f.attrs.get("model_config"))
        names = [_text(n) for n in root.attrs.get("layer_names", list(root.keys()))]
        for name in names:
            group = root.get(name)
            if not isinstance(group, h5py.Group):
                continue
            weights = {
                key.rsplit("/", 1)[-1].split(":", 1)[0]: np.asarray(item)
                for key, item in _datasets(group)
            }
            if weights:
                layers[name] = weights
    return layers, configs


def _datasets(group: Any) -> list[tuple[str, Any]]:
    """``(path inside group, dataset)`` for every dataset under an h5py group."""
    import h5py

    found: list[tuple[str, Any]] = []

    def visit(key: str, item: Any) -> None:
        if isinstance(item, h5py.Dataset):
            found.append((key, item))

    group.visititems(visit)
    return found


def _bn_partner(conv_layer: str) -> str:
    """The BatchNorm layer after a TAO conv layer."""
    if conv_layer == "conv1":
        return "bn_conv1"
    return conv_layer.replace("_conv_", "_bn_")


def _architecture(layers: dict[str, dict[str, np.ndarray]]) -> tuple[tuple[int, ...], bool]:
    blocks: dict[int, set[str]] = {}
    bottleneck = False
    for name in layers:
        match = _BLOCK_LAYER.match(name)
        if match is None:
            continue
        stage, letters, kind, which = match.groups()
        blocks.setdefault(int(stage), set()).add(letters)
        bottleneck = bottleneck or (kind == "conv" and which == "3")
    stages = tuple(len(blocks.get(s, ())) for s in range(1, max(blocks, default=0) + 1))
    return stages, bottleneck


def convert_tao_resnet(path: str | os.PathLike[str], *, target_bn_eps: float = 1e-5) -> TaoBackbone:
    """Read a TAO Keras ResNet ``.hdf5`` as torchvision ResNet tensors (see module docstring).

    Args:
        path: the Keras HDF5 file.
        target_bn_eps: the epsilon of the torch BatchNorm layers that will receive the
            running variances (torchvision's 1e-5).

    Raises:
        TaoWeightsError: no ``conv1``/``bn_conv1``/``block_*`` layers in the file.
    """
    file = Path(path)
    try:
        layers, configs = read_keras_weights(file)
    except OSError as exc:
        raise TaoWeightsError(f"{file}: not a readable HDF5 file ({exc})") from exc
    stage_blocks, bottleneck = _architecture(layers)
    if "conv1" not in layers or not stage_blocks:
        raise TaoWeightsError(
            f"{file}: an HDF5 file without TAO ResNet layers (conv1, bn_conv1, block_1a_conv_1, "
            "...); only TAO's Keras ResNet backbones are read"
        )
    result = TaoBackbone({}, {}, stage_blocks, bottleneck)
    folded_bias: list[str] = []
    eps_seen: set[float] = set()
    for layer, weights in layers.items():
        module = torch_module_name(layer)
        if module is None:
            result.ignored.extend(f"{layer}/{w}" for w in sorted(weights))
            continue
        if "kernel" in weights:
            _convert_conv(result, layer, module, weights, layers, folded_bias)
        else:
            eps = float(configs.get(layer, {}).get("epsilon", KERAS_BN_EPSILON))
            eps_seen.add(eps)
            conv = "conv1" if layer == "bn_conv1" else layer.replace("_bn_", "_conv_")
            bias = layers.get(conv, {}).get("bias")
            _convert_bn(result, layer, module, weights, eps - target_bn_eps, bias)
    if folded_bias:
        result.notes.append(
            f"{len(folded_bias)} conv biases folded into the next BatchNorm's running mean"
        )
    if eps_seen - {target_bn_eps}:
        result.notes.append(
            f"Keras BatchNorm epsilon {sorted(eps_seen)} folded into running_var "
            f"(maskops uses {target_bn_eps:g})"
        )
    if bottleneck:
        result.notes.append(
            "TAO's Bottleneck blocks stride in their first 1x1 conv, maskops' (torchvision) "
            "in the 3x3 conv: same weights, slightly different stage-boundary features "
            "until fine-tuned"
        )
    return result


def _convert_conv(
    result: TaoBackbone,
    layer: str,
    module: str,
    weights: dict[str, np.ndarray],
    layers: dict[str, dict[str, np.ndarray]],
    folded_bias: list[str],
) -> None:
    kernel = weights["kernel"]
    if kernel.ndim != 4:
        raise TaoWeightsError(
            f"{layer}/kernel has shape {kernel.shape}, expected [kh, kw, in, out]"
        )
    key = f"{module}.weight"
    oihw = np.ascontiguousarray(kernel.transpose(3, 2, 0, 1), dtype=np.float32)
    result.state_dict[key] = torch.from_numpy(oihw)
    result.source_names[key] = f"{layer}/kernel"
    if "bias" in weights and "moving_mean" in layers.get(_bn_partner(layer), {}):
        folded_bias.append(layer)
    elif "bias" in weights:
        result.ignored.append(f"{layer}/bias")
    for other in sorted(set(weights) - {"kernel", "bias"}):
        result.ignored.append(f"{layer}/{other}")


def _convert_bn(
    result: TaoBackbone,
    layer: str,
    module: str,
    weights: dict[str, np.ndarray],
    extra_eps: float,
    conv_bias: np.ndarray | None,
) -> None:
    for keras_name, value in weights.items():
        torch_name = _BN_NAMES.get(keras_name)
        if torch_name is None:
            result.ignored.append(f"{layer}/{keras_name}")
            continue
        tensor = torch.from_numpy(np.array(value, dtype=np.float32))
        if torch_name == "running_mean":
            if conv_bias is not None:
                tensor = tensor - torch.from_numpy(np.array(conv_bias, dtype=np.float32))
        elif torch_name == "running_var":
            tensor = tensor + extra_eps
        key = f"{module}.{torch_name}"
        result.state_dict[key] = tensor
        result.source_names[key] = f"{layer}/{keras_name}"
