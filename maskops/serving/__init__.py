"""Serving: a Triton model repository around an export, the Triton that serves it, and a
client for it. Every part of serving lives here; the control plane adds only its view
(``maskops_api.serving``: the API's replica pool, loading what is published).

Publishing (``maskops publish``, the publish job):

- :mod:`~maskops.serving.repository`: :func:`publish`, a new version of a
  pre/net/post ensemble, and the repository's layout;
- :mod:`~maskops.serving.model_configs`: each model's ``config.pbtxt``;
- :mod:`~maskops.serving.versions`: version numbers, the publish history, writing a
  version all or nothing;
- :mod:`~maskops.serving.placement` (CPU or GPU, the TensorRT accelerator),
  :mod:`~maskops.serving.engines` (prebuilt TensorRT engines),
  :mod:`~maskops.serving.torch_publish` (a checkpoint for the torch network backend);
- :mod:`~maskops.serving.rollout`: publish, then serve the version on every replica.

What Triton runs: ``triton_models/`` (the python models and their one ops file, which
import nothing of maskops), ``torch_network_model.py`` and :mod:`~maskops.serving.torch_network`
(the torch network backend), :mod:`~maskops.serving.processing` (the same processing in
process, the served ensemble's reference).

Talking to Triton: :mod:`~maskops.serving.client` (``infer_images``, ``roll_out``,
``retire``, ``is_ready``), :mod:`~maskops.serving.replicas` (several replicas, round robin),
:mod:`~maskops.serving.circuit` (a breaker per replica), :mod:`~maskops.serving.control`
(the model-control key), :mod:`~maskops.serving.protocol` (tensor and model names, the
answer's encoding).

Running Triton: :mod:`~maskops.serving.launcher` starts the server of the
``nvidia-pytriton`` wheel (``maskops serve``, tests); containers use
``services/triton/entrypoint.sh``.

Importing this package imports nothing heavy: the client and the protocol run in the API
image, which has neither torch nor onnx, and the launcher imports the standard library
and :mod:`maskops.process_groups` alone; the publishing names below are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from maskops.serving.protocol import EnsembleNames

if TYPE_CHECKING:
    from maskops.serving.model_configs import NET_BACKENDS, PublishError, render_configs
    from maskops.serving.repository import publish
    from maskops.serving.versions import existing_versions

_LAZY = {
    "NET_BACKENDS": "maskops.serving.model_configs",
    "PublishError": "maskops.serving.model_configs",
    "render_configs": "maskops.serving.model_configs",
    "existing_versions": "maskops.serving.versions",
    "publish": "maskops.serving.repository",
}

__all__ = [
    "NET_BACKENDS",
    "EnsembleNames",
    "PublishError",
    "existing_versions",
    "publish",
    "render_configs",
]


def __getattr__(name: str) -> Any:
    """The publishing names, imported from their modules on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
