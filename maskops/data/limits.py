"""What one dataset may hold: the bounds every reader, the conversion and the REST door
apply alike, so that a small file cannot stand for more than any image maskops reads.

Standard library only: the control plane imports it without the engine's libraries.
"""

from __future__ import annotations

MAX_PIXELS = 178_956_970
"""Pixels of one image (width x height): Pillow's ``DecompressionBombError`` threshold
(twice ``Image.MAX_IMAGE_PIXELS``), above which no image file opens. A mask, instance map
or brush region claiming a larger image is refused before anything is allocated."""
MAX_INSTANCES = 10_000
"""Objects of one image: the most ``data_config.max_num_instances`` may ask for on this
server, so no experiment could train on more; a reader keeps no more of one image."""
MAX_LABELS = 10_000
"""Category names of a dataset: the user's label list, a data.yaml's ``names`` and the
names a reader finds alike (each is in the manifest and every dataset listing)."""
MAX_LABEL_CHARS = 200
"""Characters of one category name."""
