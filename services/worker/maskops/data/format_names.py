"""The annotation formats a dataset may be registered in (readers: :mod:`maskops.data.formats`).

Kept apart from the readers so that the command line lists them without importing numpy;
defined with the conversion's options (:mod:`maskops.data.convert_options`).
"""

from maskops.data.convert_options import DEFAULT_FORMAT, FORMAT_NAMES

__all__ = ["DEFAULT_FORMAT", "FORMAT_NAMES"]
