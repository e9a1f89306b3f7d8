"""The maskops checkpoint file: save atomically, read safely, rebuild the model it holds.

A checkpoint is ``torch.save`` of a dict::

    {"format": "maskops", "version": 1,
     "model": state_dict, "spec": spec.model_dump(mode="json"),
     "label_map": label_map.to_json(), "step": int,
     # optional training state, as the trainer passes it:
     "optimizer": ..., "scheduler": ..., "scaler": ..., "rng": ..., "data_position": ...}

and is always read with ``torch.load(weights_only=True)``: tensors, containers and Python
scalars only, so loading a file never runs code from it. A pruned model uses the same
format; :func:`load_model` rebuilds its smaller layers from the stored tensor shapes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from torch import Tensor, nn

from maskops.atomic import atomic_path
from maskops.data.labels import LabelMap
from maskops.modeling import SpecMaskRCNN, build_model, resize_to_state_dict
from maskops.spec.models import ExperimentSpec

FORMAT = "maskops"


VERSION = 1


_RESERVED_KEYS = frozenset({"format", "version", "model", "spec", "label_map", "step"})


_CLASS_LOGITS_KEY = "roi_heads.box_predictor.cls_score.weight"


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
        "model": clean_state_dict(model.state_dict()),
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


def clean_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Strip DDP's ``module.`` and torch.compile's ``_orig_mod.`` prefixes."""
    cleaned = {}
    for key, value in state_dict.items():
        name = key
        for prefix in ("module.", "_orig_mod."):
            if name.startswith(prefix):
                name = name[len(prefix) :]
        cleaned[name] = value
    return cleaned


def torch_load_weights(path: Path, map_location: str | torch.device) -> Any:
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
    data = torch_load_weights(file, map_location)
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
