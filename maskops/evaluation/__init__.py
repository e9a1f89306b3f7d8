"""COCO evaluation and inference: post-processing, metrics, visualisation.

- :mod:`~maskops.evaluation.postprocess`: ``paste_masks_rle``, ``detections_to_coco``
  (model output -> COCO results; shared with export and serving).
- :class:`COCOEvaluator` + :func:`evaluate_model`: the 24 TAO-named COCO metrics.
- :func:`run_evaluation` / :func:`run_inference`: ``maskops evaluate`` / ``inference``.
- :mod:`~maskops.evaluation.predictor`: the ``Predictor`` protocol a model file becomes.
- :mod:`~maskops.evaluation.options` / :mod:`~maskops.evaluation.inference_options`: what an
  evaluation and an inference do (standard library only).

Importing this package imports nothing heavy: the names below are imported from their
modules on first use, so that the options modules are what the control plane imports of
the evaluation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maskops.evaluation.coco import METRIC_NAMES, CocoMetrics, metric_names
    from maskops.evaluation.errors import (
        EvaluationError,
        GroundTruthError,
        ImageReadError,
        ModelFileError,
    )
    from maskops.evaluation.evaluator import COCOEvaluator
    from maskops.evaluation.images import read_image
    from maskops.evaluation.inference import run_inference
    from maskops.evaluation.postprocess import detections_to_coco, paste_masks_rle
    from maskops.evaluation.predictor import (
        LoadedPredictor,
        Predictor,
        TorchPredictor,
        load_predictor,
        register_predictor_loader,
    )
    from maskops.evaluation.runner import evaluate_model, run_evaluation

_HOMES = {
    "METRIC_NAMES": "coco",
    "CocoMetrics": "coco",
    "metric_names": "coco",
    "EvaluationError": "errors",
    "GroundTruthError": "errors",
    "ImageReadError": "errors",
    "ModelFileError": "errors",
    "COCOEvaluator": "evaluator",
    "read_image": "images",
    "run_inference": "inference",
    "detections_to_coco": "postprocess",
    "paste_masks_rle": "postprocess",
    "LoadedPredictor": "predictor",
    "Predictor": "predictor",
    "TorchPredictor": "predictor",
    "load_predictor": "predictor",
    "register_predictor_loader": "predictor",
    "evaluate_model": "runner",
    "run_evaluation": "runner",
}

__all__ = [
    "METRIC_NAMES",
    "COCOEvaluator",
    "CocoMetrics",
    "EvaluationError",
    "GroundTruthError",
    "ImageReadError",
    "LoadedPredictor",
    "ModelFileError",
    "Predictor",
    "TorchPredictor",
    "detections_to_coco",
    "evaluate_model",
    "load_predictor",
    "metric_names",
    "paste_masks_rle",
    "read_image",
    "register_predictor_loader",
    "run_evaluation",
    "run_inference",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"maskops.evaluation.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
