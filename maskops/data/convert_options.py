"""What a dataset conversion does: the one definition of the dataset_convert options.

:class:`ConvertOptions` is what :func:`maskops.data.formats.convert_labelled_dataset` (and,
for COCO, :func:`maskops.data.convert.convert_dataset`) takes; the ``maskops
dataset_convert`` flags (:mod:`maskops.cli.dataset_convert`, each field's ``flag``) are the
same fields with the same defaults (tests/unit/data/test_convert_options.py checks them,
and the REST dataset's num_shards, include_masks and format). Standard library only, so
that the control plane imports it without the engine's libraries.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args

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


@dataclass(frozen=True)
class ConvertOptions:
    """The conversion's options; every one has TAO's ``maskops dataset_convert`` flag of the
    same name unless ``flag`` says otherwise."""

    format_name: str = field(default=DEFAULT_FORMAT, metadata={"flag": "--format"})
    """How the annotations are written (one of :data:`FORMAT_NAMES`);
    other formats than COCO are converted to COCO first."""
    labels: tuple[str, ...] | None = None
    """The category names in id order (id 1 first), for formats other than COCO; names
    outside it are reported as ``unknown_label``."""
    tag: str | None = None
    """The shard name prefix; default the annotation file's stem."""
    num_shards: int = DEFAULT_NUM_SHARDS
    """Requested shard count, capped so each shard holds at least ``MIN_IMAGES_PER_SHARD``
    images (and at least one shard)."""
    include_masks: bool = field(default=True, metadata={"flag": "--include_mask"})
    """Convert segmentations; False writes boxes only."""
    workers: int | None = None
    """Processes decoding and checking images; default the usable cores (at most 4). Inside
    a daemonic process (a Celery prefork worker) always 1."""
    drop_empty_images: bool = False
    """Leave out images without objects (TAO's behaviour) instead of keeping them as
    negatives."""


def cli_flag(name: str) -> str:
    """The ``maskops dataset_convert`` flag of option ``name``."""
    flag: str | None = _FIELDS[name].metadata.get("flag")
    return flag or f"--{name}"


_FIELDS = {f.name: f for f in fields(ConvertOptions)}
DEFAULTS = ConvertOptions()
"""Every option at its default."""
