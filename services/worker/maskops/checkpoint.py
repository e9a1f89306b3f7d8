"""maskops checkpoint files: save atomically, load safely, rebuild the model they hold.

A checkpoint is ``torch.save`` of a dict::

    {"format": "maskops", "version": 1,
     "model": state_dict, "spec": spec.model_dump(mode="json"),
     "label_map": label_map.to_json(), "step": int,
     # optional training state, as the trainer passes it:
     "optimizer": ..., "scheduler": ..., "scaler": ..., "rng": ..., "data_position": ...}

and is always read with ``torch.load(weights_only=True)``: tensors, containers and Python
scalars only, so loading a file never runs code from it. A pruned model uses the same
format; :func:`load_model` rebuilds its smaller layers from the stored tensor shapes.

:func:`load_weights_into` is the trainer's ``checkpoint`` / ``skip_checkpoint_variables``:
it accepts a maskops checkpoint, a torchvision detection state dict (e.g.
``maskrcnn_resnet50_fpn``'s, whose parameter names this model shares), a
``{"model": state_dict, ...}`` training checkpoint, an ImageNet ResNet state dict
(loaded into ``backbone.body``), or a TAO Toolkit pretrained ResNet backbone in Keras HDF5
(``.hdf5``; converted by :mod:`maskops.modeling.tao_keras`, also into ``backbone.body``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from torch import Tensor, nn
from torchvision.ops.misc import FrozenBatchNorm2d

from maskops.atomic import atomic_path
from maskops.data.labels import LabelMap
from maskops.modeling import SpecMaskRCNN, build_model, resize_to_state_dict
from maskops.modeling.tao_keras import (
    TaoBackbone,
    TaoWeightsError,
    convert_tao_resnet,
    is_hdf5,
    matching_depths,
)
from maskops.spec.models import ExperimentSpec

FORMAT = "maskops"
VERSION = 1
_RESERVED_KEYS = frozenset({"format", "version", "model", "spec", "label_map", "step"})
_CLASS_LOGITS_KEY = "roi_heads.box_predictor.cls_score.weight"
_BODY = "backbone.body."
_SUMMARY_ITEMS = 20
_BODY_BLOCK = re.compile(r"^backbone\.body\.layer(\d+)\.(\d+)\.conv1\.weight$")

logger = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and the problem."""


@dataclass
class LoadedModel:
    """What :func:`load_model` returns."""

    model: SpecMaskRCNN
    """In eval mode, on ``map_location``."""
    spec: ExperimentSpec
    label_map: LabelMap
    step: int
    training_state: dict[str, Any] = field(default_factory=dict)
    """Everything else the checkpoint holds (optimizer, scheduler, scaler, rng, ...)."""


@dataclass
class LoadReport:
    """What :func:`load_weights_into` did, key by key (model parameter/buffer names)."""

    loaded: list[str] = field(default_factory=list)
    skipped_by_regex: list[str] = field(default_factory=list)
    shape_mismatch: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    """``(key, shape in the file, shape in the model)``; these keep their initial values."""
    missing: list[str] = field(default_factory=list)
    """Model keys the file does not have (they keep their initial values); BatchNorm2d's
    ``num_batches_tracked`` counters are not listed."""
    unexpected: list[str] = field(default_factory=list)
    """File keys the model does not have; for a TAO ``.hdf5``, the torch name it would
    have followed by the Keras weight in parentheses, or the bare Keras weight name."""
    notes: list[str] = field(default_factory=list)
    """What a conversion did to the file's values (TAO ``.hdf5``), one sentence each."""

    def summary(self) -> str:
        """One line; for a converted file (notes), also what did not load and the notes."""
        text = (
            f"loaded {len(self.loaded)} tensors, skipped {len(self.skipped_by_regex)} by "
            f"regex, {len(self.shape_mismatch)} with other shapes, {len(self.missing)} "
            f"missing from the file, {len(self.unexpected)} not in the model"
        )
        if self.notes:
            shown = self.unexpected[:_SUMMARY_ITEMS]
            more = len(self.unexpected) - len(shown)
            listed = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
            text += f" ({listed or 'none'}); " + "; ".join(self.notes)
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every list, plus ``summary``."""
        return {
            "summary": self.summary(),
            "loaded": self.loaded,
            "skipped_by_regex": self.skipped_by_regex,
            "shape_mismatch": [
                {"key": key, "file_shape": list(a), "model_shape": list(b)}
                for key, a, b in self.shape_mismatch
            ],
            "missing": self.missing,
            "unexpected": self.unexpected,
            "notes": self.notes,
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON to ``path``; returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return target


def _check_safe(value: Any, where: str) -> None:
    """Reject values ``torch.load(weights_only=True)`` would refuse, before writing anything."""
    # Exact types: numpy scalars subclass float but do not survive a weights_only load.
    if value is None or type(value) in (bool, int, float, str, bytes, torch.dtype, torch.device):
        return
    if isinstance(value, Tensor | torch.Size):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_safe(key, where)
            _check_safe(item, f"{where}[{key!r}]")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_safe(item, f"{where}[{i}]")
        return
    raise TypeError(
        f"checkpoint field {where} is a {type(value).__name__}, which a weights_only load "
        "cannot read; store tensors, numbers, strings, lists or dicts"
    )


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: nn.Module,
    spec: ExperimentSpec,
    label_map: LabelMap,
    step: int,
    **training_state: Any,
) -> Path:
    """Write a checkpoint atomically: a reader sees the old file or the whole new one.

    ``model`` may be wrapped (DDP/``torch.compile``): the ``module.``/``_orig_mod.``
    prefixes are stripped. ``training_state`` values (optimizer/scheduler/scaler state
    dicts, RNG states as tensors, data position) must be weights_only-loadable; anything
    else is a ``TypeError`` naming the field, raised before the file is touched.

    Returns:
        The checkpoint's path.
    """
    reserved = _RESERVED_KEYS & training_state.keys()
    if reserved:
        raise TypeError(f"training_state must not use reserved keys {sorted(reserved)}")
    for key, value in training_state.items():
        _check_safe(value, key)
    payload: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "model": _clean_state_dict(model.state_dict()),
        "spec": spec.model_dump(mode="json"),
        "label_map": label_map.to_json(),
        "step": int(step),
        **training_state,
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target, durable=True) as tmp:
        torch.save(payload, tmp)
    return target


def _clean_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Strip DDP's ``module.`` and torch.compile's ``_orig_mod.`` prefixes."""
    cleaned = {}
    for key, value in state_dict.items():
        name = key
        for prefix in ("module.", "_orig_mod."):
            if name.startswith(prefix):
                name = name[len(prefix) :]
        cleaned[name] = value
    return cleaned


def _torch_load(path: Path, map_location: str | torch.device) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable weights file ({first_line})") from exc


def read_checkpoint(
    path: str | os.PathLike[str], *, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """The raw dict of a maskops checkpoint, after checking its format and version."""
    file = Path(path)
    data = _torch_load(file, map_location)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(
            f"{file}: not a maskops checkpoint (no 'format': 'maskops' entry); "
            "plain torchvision weights go in the spec's 'checkpoint' field instead"
        )
    if data.get("version") != VERSION:
        raise CheckpointError(
            f"{file}: checkpoint version {data.get('version')!r} is not supported "
            f"(this maskops reads version {VERSION})"
        )
    missing = sorted({"model", "spec", "label_map", "step"} - data.keys())
    if missing:
        raise CheckpointError(f"{file}: checkpoint lacks {', '.join(missing)}")
    return data


def load_model(
    path: str | os.PathLike[str], *, map_location: str | torch.device = "cpu"
) -> LoadedModel:
    """Rebuild the model a maskops checkpoint holds (pruned or not), in eval mode.

    The architecture comes from the stored spec's ``maskrcnn_config`` and
    ``data_config.image_size``; the number of classes from the stored class-logits layer;
    pruned layers from the state dict's tensor shapes.
    """
    file = Path(path)
    data = read_checkpoint(file, map_location=map_location)
    try:
        spec = ExperimentSpec.model_validate(data["spec"])
    except ValidationError as exc:
        raise CheckpointError(f"{file}: stored spec is invalid: {exc.errors()[0]['msg']}") from exc
    try:
        label_map = LabelMap.from_json(data["label_map"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{file}: stored label map is invalid: {exc}") from exc
    state_dict: dict[str, Tensor] = data["model"]
    if _CLASS_LOGITS_KEY not in state_dict:
        raise CheckpointError(f"{file}: model weights lack {_CLASS_LOGITS_KEY}")
    num_classes = int(state_dict[_CLASS_LOGITS_KEY].shape[0])

    model = build_model(
        spec.maskrcnn_config, num_classes=num_classes, image_size=spec.data_config.image_size
    )
    resize_to_state_dict(model, state_dict)
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as exc:
        first_line = str(exc).strip().splitlines()[0]
        raise CheckpointError(
            f"{file}: weights do not fit the architecture its spec describes ({first_line})"
        ) from exc
    model.to(map_location).eval()
    extra = {k: v for k, v in data.items() if k not in _RESERVED_KEYS}
    return LoadedModel(
        model=model,
        spec=spec,
        label_map=label_map,
        step=int(data["step"]),
        training_state=extra,
    )


def _extract_state_dict(data: Any, file: Path) -> dict[str, Tensor]:
    """The tensor dict inside any of the weight-file shapes load_weights_into accepts."""
    if isinstance(data, dict) and data.get("format") == FORMAT:
        data = data["model"]
    elif isinstance(data, dict) and not any(isinstance(v, Tensor) for v in data.values()):
        for key in ("model", "state_dict", "model_state_dict"):
            if isinstance(data.get(key), dict):
                data = data[key]
                break
    if not isinstance(data, dict) or not data:
        raise CheckpointError(f"{file}: holds no state dict (expected a dict of tensors)")
    tensors = {str(k): v for k, v in data.items() if isinstance(v, Tensor)}
    if not tensors:
        raise CheckpointError(f"{file}: holds no tensors")
    tensors = _clean_state_dict(tensors)
    # An ImageNet classification ResNet (conv1/layerN/fc at the top level) goes into the
    # detection backbone's body.
    if "conv1.weight" in tensors and "backbone.body.conv1.weight" not in tensors:
        tensors = {f"backbone.body.{k}": v for k, v in tensors.items() if not k.startswith("fc.")}
    return tensors


def load_weights_into(
    model: nn.Module, path: str | os.PathLike[str], *, skip_regex: str = ""
) -> LoadReport:
    """Copy the matching tensors of a weights file into ``model`` (in place).

    Args:
        model: the freshly built model (unwrapped).
        path: a maskops checkpoint or torchvision-style weights file (see module docstring).
        skip_regex: model keys it matches (``re.search``) keep their initial values: the
            spec's ``skip_checkpoint_variables``. Empty = skip nothing.

    Returns:
        A :class:`LoadReport`. Tensors whose shapes differ are not loaded, only reported.
    """
    file = Path(path)
    try:
        pattern = re.compile(skip_regex) if skip_regex else None
    except re.error as exc:
        raise ValueError(f"skip_checkpoint_variables: invalid regex {skip_regex!r}: {exc}") from exc
    target = model.state_dict()
    origins: dict[str, str] = {}
    tao: TaoBackbone | None = None
    if is_hdf5(file):
        tao = _read_tao_backbone(model, file, target)
        source = {_BODY + k: v for k, v in tao.state_dict.items()}
        origins = {_BODY + k: v for k, v in tao.source_names.items()}
    elif file.suffix in (".tlt", ".etlt") and file.is_file():
        raise CheckpointError(
            f"{file}: TAO's encrypted {file.suffix} models cannot be read; start from TAO's "
            "pretrained .hdf5 backbone or a torchvision/maskops weights file"
        )
    else:
        source = _extract_state_dict(_torch_load(file, "cpu"), file)
    report = LoadReport(
        unexpected=[
            f"{k} ({origins[k]})" if k in origins else k for k in sorted(set(source) - set(target))
        ]
    )
    if tao is not None:
        report.unexpected.extend(tao.ignored)
        report.notes.extend(tao.notes)
        projected = sorted(
            {
                v.split("/")[0]
                for k, v in origins.items()
                if k not in target and "_conv_shortcut" in v
            }
        )
        if projected:
            report.notes.append(
                f"the file projects the shortcut of {', '.join(projected)} (1x1 conv) where "
                "maskops' ResNet adds the block input unchanged: those projections are not loaded"
            )
    to_load: dict[str, Tensor] = {}
    for key, current in target.items():
        if key not in source:
            # FrozenBatchNorm2d (torchvision's detection checkpoints) has no batch counter;
            # a BatchNorm2d's counter only matters for momentum=None, which nothing uses.
            if not key.endswith("num_batches_tracked"):
                report.missing.append(key)
        elif pattern is not None and pattern.search(key):
            report.skipped_by_regex.append(key)
        elif tuple(source[key].shape) != tuple(current.shape):
            report.shape_mismatch.append((key, tuple(source[key].shape), tuple(current.shape)))
        else:
            to_load[key] = source[key]
            report.loaded.append(key)
    if not to_load:
        raise CheckpointError(
            f"{file}: no tensor in it matches the model ({report.summary()}); "
            "is it a Mask R-CNN/ResNet weights file?"
        )
    model.load_state_dict(to_load, strict=False)
    if tao is not None:
        _log_tao_report(file, report)
    return report


def _log_tao_report(file: Path, report: LoadReport) -> None:
    body_missing = [k for k in report.missing if k.startswith(_BODY)]
    logger.info("%s (TAO Keras ResNet): %s", file, report.summary())
    for note in report.notes:
        logger.info("%s: %s", file, note)
    if report.unexpected:
        logger.warning("%s: not loaded (not in this model): %s", file, report.unexpected)
    if report.shape_mismatch:
        logger.warning(
            "%s: not loaded (other shapes): %s", file, [k for k, _, _ in report.shape_mismatch]
        )
    if body_missing:
        logger.warning("%s: backbone tensors the file lacks: %s", file, body_missing)


def _model_resnet(keys: Collection[str]) -> tuple[tuple[int, ...], bool]:
    """``(blocks per stage, bottleneck)`` of the model's ``backbone.body``."""
    blocks: dict[int, int] = {}
    for key in keys:
        match = _BODY_BLOCK.match(key)
        if match:
            stage, index = int(match.group(1)), int(match.group(2))
            blocks[stage] = max(blocks.get(stage, 0), index + 1)
    bottleneck = any(k.startswith(_BODY) and k.endswith(".conv3.weight") for k in keys)
    return tuple(blocks[s] for s in sorted(blocks)), bottleneck


def _resnet_name(stage_blocks: tuple[int, ...], bottleneck: bool) -> str:
    """``ResNet-50`` (or ``ResNet-50/101`` when only the first stages are known)."""
    depths = matching_depths(stage_blocks, bottleneck=bottleneck)
    if depths:
        return "ResNet-" + "/".join(str(d) for d in depths)
    kind = "Bottleneck" if bottleneck else "BasicBlock"
    return f"ResNet with {list(stage_blocks)} {kind} blocks per stage"


def _read_tao_backbone(model: nn.Module, file: Path, target: Mapping[str, Tensor]) -> TaoBackbone:
    """The TAO ``.hdf5`` converted, after checking it is the model's ResNet."""
    eps = next(
        (m.eps for m in model.modules() if isinstance(m, nn.BatchNorm2d | FrozenBatchNorm2d)),
        1e-5,
    )
    try:
        tao = convert_tao_resnet(file, target_bn_eps=float(eps))
    except TaoWeightsError as exc:
        raise CheckpointError(str(exc)) from exc
    stages, bottleneck = _model_resnet(list(target))
    if not stages:
        raise CheckpointError(f"{file}: a TAO ResNet backbone, but the model has no ResNet body")
    if bottleneck != tao.bottleneck or tao.stage_blocks[: len(stages)] != stages:
        theirs = _resnet_name(tao.stage_blocks, tao.bottleneck)
        ours = _resnet_name(stages, bottleneck)
        raise CheckpointError(
            f"{file}: a TAO {theirs} backbone, but the spec's model is {ours} "
            f"(maskrcnn_config.nlayers); use the {ours} pretrained model or set nlayers to "
            f"{theirs.removeprefix('ResNet-')}"
        )
    return tao
