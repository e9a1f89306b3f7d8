"""The annotation formats a dataset may be registered in (readers: :mod:`maskops.data.formats`).

Kept apart from the readers so that the command line lists them without importing numpy.
"""

FORMAT_NAMES = ("coco", "via", "labelme", "cvat", "labelstudio", "voc", "yolo-seg")
DEFAULT_FORMAT = "coco"
