"""Predictors: whatever turns a batch of preprocessed images into Mask R-CNN outputs.

Evaluation and inference work on any :class:`Predictor`, so the same code measures a
PyTorch checkpoint and a deployed artefact (ONNX, INT8). A model file is opened with
:func:`load_predictor`, which picks a loader by file suffix: maskops checkpoints are built
in; other formats register a loader with :func:`register_predictor_loader` (or provide
``maskops.export.predictor.load_predictor`` for ``.onnx``, imported on first use).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from maskops.data.labels import LabelMap
from maskops.evaluation.errors import EvaluationError, ModelFileError
from maskops.spec.models import ExperimentSpec

Output = dict[str, torch.Tensor]
"""One image's detections: ``boxes`` ``[N, 4]`` xyxy (model input frame), ``labels`` ``[N]``
int64 training labels, ``scores`` ``[N]``, optional ``masks`` ``[N, 1, M, M]`` mask
probabilities over each box."""


@runtime_checkable
class Predictor(Protocol):
    """Runs detection on a batch.

    Called with a list of ``[3, H, W]`` images, already ``resize_and_pad``-ed to the
    model's image size: uint8 in 0..255 (``keep_uint8``: a quarter of the bytes to move to
    a device, where they are divided by 255 exactly as the host would,
    :func:`maskops.modeling.transform.unit_range`) or float32 in 0..1; returns one
    :data:`Output` per image, on the CPU. A predictor that only takes one input size (an
    exported graph) says so with an ``image_size`` attribute ``(H, W)``; see
    :func:`check_input_size`.
    """

    def __call__(self, images: Sequence[torch.Tensor]) -> list[Output]: ...


class TorchPredictor:
    """A :class:`Predictor` over an eager PyTorch Mask R-CNN.

    Args:
        model: a maskops/torchvision Mask R-CNN; put in eval mode for each call and left
            in the mode it had before (the trainer evaluates mid-training).
        device: where to run; defaults to the model's device.
        autocast_dtype: run under ``torch.autocast`` with this dtype (e.g. bfloat16); None
            runs in the model's own precision.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        device: torch.device | None = None,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.device = device or next(model.parameters()).device
        self.autocast_dtype = autocast_dtype

    def __call__(self, images: Sequence[torch.Tensor]) -> list[Output]:
        was_training = self.model.training
        self.model.eval()
        try:
            with (
                torch.inference_mode(),
                torch.autocast(
                    self.device.type,
                    dtype=self.autocast_dtype or torch.float32,
                    enabled=self.autocast_dtype is not None,
                ),
            ):
                outputs = self.model([image.to(self.device) for image in images])
        finally:
            self.model.train(was_training)
        return [
            {
                key: value.detach().float().cpu() if value.is_floating_point() else value.cpu()
                for key, value in output.items()
            }
            for output in outputs
        ]


@dataclass(frozen=True)
class LoadedPredictor:
    """A predictor with what it was trained with (its spec decides the architecture and
    whether it predicts masks; its label map decides the category ids)."""

    predictor: Predictor
    spec: ExperimentSpec
    label_map: LabelMap
    source: Path

    @property
    def include_mask(self) -> bool:
        return self.spec.maskrcnn_config.include_mask


PredictorLoader = Callable[[Path, torch.device], LoadedPredictor]

_LOADERS: dict[str, PredictorLoader] = {}
_LAZY_LOADERS: dict[str, str] = {".onnx": "maskops.export.predictor:load_predictor"}
"""Suffix -> ``module:function`` of loaders living in modules imported only when needed."""


def register_predictor_loader(suffix: str, loader: PredictorLoader) -> None:
    """Make :func:`load_predictor` open files ending in ``suffix`` (e.g. ``".onnx"``)."""
    _LOADERS[suffix.lower()] = loader


def _load_checkpoint(path: Path, device: torch.device) -> LoadedPredictor:
    from maskops.checkpoints.model_file import load_model

    loaded = load_model(path, map_location=device)
    return LoadedPredictor(
        predictor=TorchPredictor(loaded.model.to(device), device=device),
        spec=loaded.spec,
        label_map=loaded.label_map,
        source=path,
    )


def load_predictor(path: str | Path, *, device: torch.device | str = "cpu") -> LoadedPredictor:
    """Open a model file as a predictor: a maskops checkpoint, or a registered format.

    Raises:
        ModelFileError: missing file or unknown format.
    """
    path = Path(path)
    device = torch.device(device)
    if not path.is_file():
        raise ModelFileError(f"{path}: model file not found")
    suffix = path.suffix.lower()
    if suffix not in _LOADERS and suffix in _LAZY_LOADERS:
        module_name, _, function = _LAZY_LOADERS[suffix].partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            raise ModelFileError(f"{path}: {suffix} models are not supported yet") from None
        register_predictor_loader(suffix, getattr(module, function))
    loader = _LOADERS.get(suffix, _load_checkpoint)
    return loader(path, device)


def check_input_size(loaded: LoadedPredictor, image_size: tuple[int, int]) -> None:
    """Fail early when a fixed-size predictor cannot take the spec's ``image_size``.

    Raises:
        EvaluationError: naming the model file and both sizes.
    """
    fixed = getattr(loaded.predictor, "image_size", None)
    if fixed is not None and tuple(fixed) != tuple(image_size):
        raise EvaluationError(
            f"{loaded.source}: takes images of {tuple(fixed)} (H, W) only, but the spec's "
            f"data_config.image_size is {tuple(image_size)}"
        )
