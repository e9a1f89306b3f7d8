"""The annotation formats a dataset may be registered in (readers: :mod:`maskops.data.formats`).

Kept apart from the readers, and standard library only, so that the command line lists
them without importing numpy and the control plane's core takes its ``format`` field's
choices from here.
"""

from typing import Literal, get_args

DatasetFormat = Literal["coco", "via", "labelme", "cvat", "labelstudio", "voc", "yolo-seg"]
FORMAT_NAMES: tuple[str, ...] = get_args(DatasetFormat)
DEFAULT_FORMAT = "coco"
