"""Serving: a Triton model repository around an export, and a client for it.

- :func:`publish` writes a new version of a pre/net/post ensemble (see
  :mod:`maskops.serving.repository` for the layout and tensor names).
- :mod:`maskops.serving.client`: ``infer_images``, ``load_model``/``unload_model``,
  ``roll_out`` (serve the newest version without interruption), ``is_ready``.

The engine never imports tritonclient at import time of :mod:`maskops.serving`: the client
module is imported on use.
"""

from maskops.serving.repository import (
    NET_BACKENDS,
    EnsembleNames,
    PublishError,
    existing_versions,
    publish,
    render_configs,
)

__all__ = [
    "NET_BACKENDS",
    "EnsembleNames",
    "PublishError",
    "existing_versions",
    "publish",
    "render_configs",
]
