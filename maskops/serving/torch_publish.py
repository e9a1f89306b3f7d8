"""What publish needs of a checkpoint for the ``torch`` network backend.

The torch backend serves a train or prune job's checkpoint as it is (no export): its
graph contract is read from the checkpoint instead of an ONNX file's metadata, as the
same :class:`~maskops.export.graph.GraphMetadata`, so that the pre- and post-processing
models and the ensemble are written exactly as for an export.
"""

from __future__ import annotations

from pathlib import Path

from maskops.checkpoints.model_file import CheckpointError, load_model
from maskops.export.graph import GraphMetadata

CHECKPOINT_FILENAME = "model.pth"
"""The checkpoint's name in the network's version folder."""
DEFAULT_MAX_BATCH_SIZE = 8
"""Triton's max_batch_size for a checkpoint (an export carries its own)."""


class NotACheckpoint(ValueError):
    """The file is no maskops checkpoint (the message names it and why)."""


def checkpoint_metadata(path: Path, *, max_batch_size: int | None = None) -> GraphMetadata:
    """The graph contract of checkpoint ``path``: fp32 outputs, dynamic batch up to
    ``max_batch_size`` (default :data:`DEFAULT_MAX_BATCH_SIZE`), the spec's image size.

    Raises:
        NotACheckpoint: missing, an ONNX export, or not loadable as a maskops checkpoint.
    """
    if not path.is_file():
        raise NotACheckpoint(f"{path}: no such checkpoint file")
    if path.suffix.lower() == ".onnx":
        raise NotACheckpoint(
            f"{path}: an ONNX export; the torch net backend serves the train or prune "
            "job's checkpoint (publish the export with net backend python, onnxruntime "
            "or tensorrt)"
        )
    try:
        loaded = load_model(path, map_location="cpu")
    except (CheckpointError, OSError, RuntimeError, ValueError, KeyError) as exc:
        raise NotACheckpoint(f"{path}: not a maskops checkpoint ({exc})") from None
    size = loaded.spec.data_config.image_size
    return GraphMetadata(
        spec=loaded.spec,
        label_map=loaded.label_map,
        data_type="fp32",
        image_size=(int(size[0]), int(size[1])),
        max_detections=int(loaded.model.roi_heads.detections_per_img),
        mask_resolution=int(loaded.spec.maskrcnn_config.mrcnn_resolution),
        max_batch_size=max_batch_size or DEFAULT_MAX_BATCH_SIZE,
    )
