"""The error type of evaluation and inference: bad input, reported as one line."""

from __future__ import annotations


class EvaluationError(ValueError):
    """Input that evaluation or inference cannot use; the message names the file or field."""


class GroundTruthError(EvaluationError):
    """The ground-truth annotation file cannot be used."""


class ModelFileError(EvaluationError):
    """The model file cannot be opened."""


class ImageReadError(EvaluationError):
    """An image cannot be read."""
