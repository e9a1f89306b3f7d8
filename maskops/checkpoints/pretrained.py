"""Starting weights from another file: the spec's ``checkpoint`` and
``skip_checkpoint_variables`` (:func:`load_weights_into`).

It accepts a maskops checkpoint, a torchvision detection state dict (e.g.
``maskrcnn_resnet50_fpn``'s, whose parameter names this model shares), a
``{"model": state_dict, ...}`` training checkpoint, an ImageNet ResNet state dict
(loaded into ``backbone.body``), an mmdetection COCO checkpoint (renamed; detectron2's are
refused, naming the difference: :mod:`maskops.checkpoints.foreign_layouts`), or a TAO
Toolkit pretrained ResNet backbone in Keras HDF5 (``.hdf5``; converted by
:mod:`maskops.modeling.tao_keras`, also into ``backbone.body``).
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

from torch import Tensor, nn
from torchvision.ops.misc import FrozenBatchNorm2d

from maskops.checkpoints.foreign_layouts import from_framework
from maskops.checkpoints.hub import resolve_checkpoint
from maskops.checkpoints.model_file import (
    FORMAT,
    CheckpointError,
    clean_state_dict,
    torch_load_weights,
)
from maskops.modeling.tao_keras import (
    TaoBackbone,
    TaoWeightsError,
    convert_tao_resnet,
    is_hdf5,
    matching_depths,
)

_BODY = "backbone.body."


_SUMMARY_ITEMS = 20


_BODY_BLOCK = re.compile(r"^backbone\.body\.layer(\d+)\.(\d+)\.conv1\.weight$")


logger = logging.getLogger(__name__)


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


def _extract_state_dict(data: Any, file: Path, model_keys: Collection[str]) -> dict[str, Tensor]:
    """The tensor dict inside any of the weight-file shapes load_weights_into accepts, in
    this model's names (mmdetection's renamed: :mod:`maskops.checkpoints.foreign_layouts`)."""
    raw = data
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
    tensors = from_framework(clean_state_dict(tensors), raw, file, model_keys)
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
        path: a maskops checkpoint or torchvision-style weights file (see module docstring),
            or a torchvision weights name or ``URL#sha256=HEX``, fetched into the weights
            cache first (:func:`maskops.checkpoints.hub.fetch_weights`).
        skip_regex: model keys it matches (``re.search``) keep their initial values: the
            spec's ``skip_checkpoint_variables``. Empty = skip nothing.

    Returns:
        A :class:`LoadReport`. Tensors whose shapes differ are not loaded, only reported.
    """
    file = resolve_checkpoint(path)
    try:
        report = _load_file(model, file, skip_regex)
    except CheckpointError as exc:
        if os.fspath(path) == os.fspath(file):
            raise
        raise CheckpointError(f"{os.fspath(path)} ({exc})") from exc
    if report.shape_mismatch and not is_hdf5(file):  # the TAO path logs its own report
        _log_reinitialised(path, report)
    return report


def _load_file(model: nn.Module, file: Path, skip_regex: str) -> LoadReport:
    """:func:`load_weights_into` for a local file."""
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
        source = _extract_state_dict(torch_load_weights(file, "cpu"), file, list(target))
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


def _log_reinitialised(path: str | os.PathLike[str], report: LoadReport) -> None:
    """Name the tensors that keep their initial values because their shapes differ: for a
    COCO or ImageNet checkpoint, the class heads of a dataset with other classes."""
    classes = [
        f"{theirs[0]} classes in the file, {ours[0]} in the model"
        for key, theirs, ours in report.shape_mismatch
        if key.endswith("cls_score.weight")
    ]
    logger.warning(
        "checkpoint %s: re-initialised (other shapes%s): %s",
        os.fspath(path),
        f": {classes[0]}" if classes else "",
        ", ".join(key for key, _, _ in report.shape_mismatch),
    )


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
