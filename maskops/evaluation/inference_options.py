# ruff: noqa: RUF009 - option() is dataclasses.field with the declared metadata
"""What an inference does: the declaration of the inference options.

:class:`InferenceOptions` is what :func:`maskops.evaluation.inference.run_inference` takes;
the ``maskops inference`` flags and the REST inference job's options are built from its
fields (:mod:`maskops.options_schema`). Standard library only, so that the control plane's
core imports it without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from maskops.data.convert_options import PREDICTION_FORMATS, PredictionFormat
from maskops.evaluation.options import GPU_INDEX
from maskops.options_schema import GPU_INDEX_HELP, MAX_GPU_INDEX, option

THRESHOLD = 0.6
"""The score under which detections are neither drawn nor written, by default."""


@dataclass(frozen=True)
class InferenceOptions:
    """The inference's options (declared: :mod:`maskops.options_schema`); ``exports``,
    ``polygon_tolerance`` and ``model_version`` say how the predictions are exported after
    the inference (:func:`maskops.data.formats.predictions.export_predictions`)."""

    threshold: float = option(
        THRESHOLD,
        help=f"minimum score: detections below it are neither drawn nor written (default "
        f"{THRESHOLD})",
        flag=("-t", "--threshold"),
        rest=True,
        ge=0.0,
        le=1.0,
    )
    include_mask: bool = option(
        False,
        help="draw instance masks (a job draws them unless told not to)",
        rest=True,
        rest_default=True,
    )
    gpu_index: int | None = option(
        GPU_INDEX, help=GPU_INDEX_HELP, rest=True, ge=0, le=MAX_GPU_INDEX
    )
    annotations: Path | None = option(
        None, help="COCO JSON giving the ids of the images it lists (default: val_json_file)"
    )
    exports: tuple[PredictionFormat, ...] = option(
        (),
        help="also write the predictions for review in a labelling tool: coco (COCO "
        "documents with polygon and with RLE masks), cvat (CVAT for images 1.1 XML), "
        "labelstudio (Label Studio pre-annotations, polygons), labelstudio-brush (the same "
        "as brush masks); into exports/ beside the labels",
        flag="--export",
        rest=True,
        max_items=len(PREDICTION_FORMATS),
        cli={"action": "append"},
    )
    polygon_tolerance: float = option(
        1.0,
        help="Douglas-Peucker tolerance (pixels) simplifying mask outlines to the exported "
        "polygons; at most 2% of the square root of an object's area",
        rest=True,
        ge=0.0,
        le=50.0,
    )
    model_version: str | None = option(
        None,
        help="Label Studio's model_version on the pre-annotations (default: maskops; a "
        "job's: 'job-<id>' of its model's job)",
        rest=True,
        max_length=200,
        cli_default="maskops",
    )


DEFAULTS = InferenceOptions()
"""Every option at its default."""
