# ruff: noqa: RUF009 - option() is dataclasses.field with the declared metadata
"""What a dataset conversion does: the one definition of the dataset_convert options.

:class:`ConvertOptions` is what :func:`maskops.data.formats.convert_labelled_dataset` (and,
for COCO, :func:`maskops.data.convert.convert_dataset`) takes; each field is declared with
:func:`maskops.options_schema.option`, from which the ``maskops dataset_convert`` flags
(:mod:`maskops.cli.dataset_convert`) and the REST dataset's conversion fields
(``maskops_api.schemas.DatasetCreate``) are built. Standard library only, so that the
control plane imports it without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from maskops.data.limits import MAX_LABELS
from maskops.options_schema import option

DatasetFormat = Literal["coco", "via", "labelme", "cvat", "labelstudio", "voc", "yolo-seg"]
"""The annotation formats a dataset may be registered in (readers:
:mod:`maskops.data.formats`); the REST door takes its choices from here too."""
FORMAT_NAMES: tuple[str, ...] = get_args(DatasetFormat)
PredictionFormat = Literal["coco", "cvat", "labelstudio", "labelstudio-brush"]
"""The labelling tools' files an inference's predictions are exported as
(:mod:`maskops.data.formats.predictions`)."""
PREDICTION_FORMATS: tuple[str, ...] = get_args(PredictionFormat)
DEFAULT_FORMAT = "coco"
DEFAULT_NUM_SHARDS = 256
"""The shards requested by default (capped so that each holds enough images)."""


REST_NUM_SHARDS = 8
"""The REST dataset's shards by default: it registers small datasets."""
MAX_NUM_SHARDS = 1024
"""The most shards a REST dataset may ask for."""


@dataclass(frozen=True)
class ConvertOptions:
    """The conversion's options (each a ``maskops dataset_convert`` flag with TAO's
    spelling; ``format``, ``labels``, ``num_shards`` and ``include_masks`` are the REST
    dataset's fields too)."""

    format_name: DatasetFormat = option(
        DEFAULT_FORMAT,
        help="how the annotations are written: coco, via (via_region_data.json), labelme (a "
        "folder of per-image JSON), cvat (CVAT for images 1.1 XML), labelstudio (JSON "
        "export), voc (a folder with SegmentationObject/ and SegmentationClass/), yolo-seg "
        "(a folder of .txt); the others are converted to COCO first (<tag>_coco.json "
        "next to the shards)",
        flag="--format",
        rest="format",
    )
    labels: tuple[str, ...] | None = option(
        None,
        help="category names in id order (id 1 first; comma-separated on the command line); "
        "objects with other labels are reported as unknown_label and left out (default: "
        "names in order of appearance; voc: VOC's 20 classes; yolo-seg: data.yaml's names; "
        "coco files carry their own category ids)",
        rest=True,
        max_items=MAX_LABELS,
    )
    tag: str | None = option(
        None,
        help="shard name prefix (default: the annotation file's stem)",
        flag=("-t", "--tag"),
    )
    num_shards: int = option(
        DEFAULT_NUM_SHARDS,
        help="number of shards (capped so each holds at least 16 images)",
        flag=("-s", "--num_shards"),
        rest=True,
        ge=1,
        le=MAX_NUM_SHARDS,
        rest_default=REST_NUM_SHARDS,
    )
    include_masks: bool = option(
        True,
        help="convert segmentation masks (default); off (--no-include_mask): boxes only",
        # TAO's documentation spells it both ways.
        flag=("--include_mask", "--include_masks"),
        rest=True,
    )
    workers: int | None = option(
        None,
        help="image-checking processes (default: the usable cores, at most 4; inside a "
        "daemonic process such as a Celery prefork worker always 1)",
    )
    drop_empty_images: bool = option(
        False,
        help="leave out images without objects, as TAO does (default: keep them as "
        "negatives, counted in the manifest)",
    )


DEFAULTS = ConvertOptions()
"""Every option at its default."""
