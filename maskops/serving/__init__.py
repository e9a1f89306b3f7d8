"""Serving: a Triton model repository around an export, and a client for it.

- :func:`publish` writes a new version of a pre/net/post ensemble (see
  :mod:`maskops.serving.repository` for the layout).
- :mod:`maskops.serving.client`: ``infer_images``, ``load_model``/``unload_model``,
  ``roll_out`` (serve the newest version without interruption), ``retire``, ``is_ready``.
- :mod:`maskops.serving.protocol`: tensor and model names, the answer's encoding.

Importing this package imports nothing heavy: the client and the protocol run in the API
image, which has neither torch nor onnx, while the publishing names below live in
:mod:`maskops.serving.repository` (onnx, the spec) and are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from maskops.serving.protocol import EnsembleNames

if TYPE_CHECKING:
    from maskops.serving.repository import (
        NET_BACKENDS,
        PublishError,
        existing_versions,
        publish,
        render_configs,
    )

_FROM_REPOSITORY = frozenset(
    {"NET_BACKENDS", "PublishError", "existing_versions", "publish", "render_configs"}
)

__all__ = [
    "NET_BACKENDS",
    "EnsembleNames",
    "PublishError",
    "existing_versions",
    "publish",
    "render_configs",
]


def __getattr__(name: str) -> Any:
    """The publishing names, imported from :mod:`maskops.serving.repository` on use."""
    if name in _FROM_REPOSITORY:
        return getattr(importlib.import_module("maskops.serving.repository"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
