"""COCO evaluation and inference: post-processing, metrics, visualisation.

- :mod:`~maskops.evaluation.postprocess`: ``paste_masks_rle``, ``detections_to_coco``
  (model output -> COCO results; shared with export and serving).
- :class:`COCOEvaluator` + :func:`evaluate_model`: the 24 TAO-named COCO metrics.
- :func:`run_evaluation` / :func:`run_inference`: ``maskops evaluate`` / ``inference``.
- :mod:`~maskops.evaluation.predictor`: the ``Predictor`` protocol a model file becomes.
"""

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
