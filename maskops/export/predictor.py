"""Run an exported ONNX model with onnxruntime, with the eager model's call shape.

``OnnxPredictor(images)`` takes a list of float32 ``[3, H, W]`` images in 0..1, already
``resize_and_pad``-ed to the export's image size, and returns one dict per image exactly
like the PyTorch model's eval output (``boxes`` ``[N, 4]`` xyxy input frame, ``labels``
``[N]`` int64, ``scores`` ``[N]``, ``masks`` ``[N, 1, M, M]`` probabilities), so
``maskops evaluate -m model.onnx`` and the parity check use the same code as for a
checkpoint. A file whose metadata says ``input_convention`` "tao" (the TAO layout's
``Input``) gets those images as TAO's nvinfer preprocessing makes them
(:func:`maskops.export.tao_layout.tao_input`). :func:`load_predictor` is the ``.onnx``
loader that :mod:`maskops.evaluation.predictor` looks up by suffix.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from maskops.evaluation.errors import ModelFileError
from maskops.evaluation.predictor import LoadedPredictor
from maskops.export.graph import (
    INPUT_NAME,
    OUTPUT_NAMES,
    TAO_INPUT_NAME,
    GraphMetadata,
    read_metadata,
)
from maskops.export.tao_layout import TAO_OUTPUT_NAMES, decode_tao_outputs, tao_input
from maskops.modeling.transform import unit_range
from maskops.serving.triton_models.maskops_serving_ops import run_batched

Output = dict[str, torch.Tensor]


def session_options(*, threads: int | None = None) -> ort.SessionOptions:
    """Full graph optimisation; ``threads`` intra-op threads (default: onnxruntime's)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    return options


def default_providers() -> list[str]:
    """CUDA when this onnxruntime build has it, else the CPU."""
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def unpad(outputs: Sequence[np.ndarray], index: int = 0) -> Output:
    """One image's detections from the graph's padded outputs (see maskops.export.graph)."""
    boxes, scores, labels, masks, count = outputs
    n = int(count[index].reshape(-1)[0])
    return {
        "boxes": torch.from_numpy(np.ascontiguousarray(boxes[index, :n], dtype=np.float32)),
        "scores": torch.from_numpy(np.ascontiguousarray(scores[index, :n], dtype=np.float32)),
        "labels": torch.from_numpy(np.ascontiguousarray(labels[index, :n], dtype=np.int64)),
        "masks": torch.from_numpy(np.ascontiguousarray(masks[index, :n, None], dtype=np.float32)),
    }


class GraphPredictor:
    """A :class:`maskops.evaluation.predictor.Predictor` over an exported graph, whichever
    runtime runs it (:meth:`run_outputs`): the batching, the TAO input and output layout
    and the unpadding its :attr:`metadata` calls for."""

    def __init__(self, metadata: GraphMetadata) -> None:
        self.metadata = metadata

    def run_outputs(self, names: Sequence[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The graph's outputs ``names`` for the inputs ``feed`` (name -> array)."""
        raise NotImplementedError

    @property
    def image_size(self) -> tuple[int, int]:
        return self.metadata.image_size

    @property
    def batch_size(self) -> int:
        """Images per graph run: the graph's static batch, else the export's max_batch_size."""
        return self.metadata.batch_size or self.metadata.max_batch_size

    def run_padded(self, images: np.ndarray) -> list[np.ndarray]:
        """Run the graph on a ``[n, 3, H, W]`` float32 array of RGB 0..1 images (fed as
        TAO's preprocessing makes them to a TAO-input file); the five padded outputs
        (decoded from TAO's two for a TAO-layout file).

        A graph of static batch ``S`` gets ``n`` = S; a dynamic one any ``n`` >= 1.
        """
        feed = {INPUT_NAME: images}
        if self.metadata.input_convention == "tao":
            feed = {TAO_INPUT_NAME: tao_input(images)}
        if self.metadata.output_layout == "tao":
            detections, masks = self.run_outputs(list(TAO_OUTPUT_NAMES), feed)
            return decode_tao_outputs(detections, masks)
        return self.run_outputs(list(OUTPUT_NAMES), feed)

    def __call__(self, images: Sequence[torch.Tensor]) -> list[Output]:
        """The detections of each image, run ``batch_size`` images at a time."""
        for index, image in enumerate(images):
            if tuple(image.shape) != (3, *self.image_size):
                raise ValueError(
                    f"image {index}: expected [3, {self.image_size[0]}, {self.image_size[1]}] "
                    f"(resize_and_pad to the export's image size), got {tuple(image.shape)}"
                )
        outputs: list[Output] = []
        for start in range(0, len(images), self.batch_size):
            chunk = images[start : start + self.batch_size]
            batch = torch.stack([unit_range(image.detach().cpu()).float() for image in chunk])
            # The served network's batching rule (a static graph's last run is filled).
            padded = run_batched(self.run_padded, batch.numpy(), self.metadata.batch_size)
            outputs.extend(unpad(padded, index) for index in range(len(chunk)))
        return outputs


class OnnxPredictor(GraphPredictor):
    """A :class:`GraphPredictor` over an exported ONNX file, on onnxruntime.

    Args:
        source: the ``.onnx`` path, or the serialized model bytes (with ``metadata``).
        providers: onnxruntime execution providers (default: CUDA if present, else CPU).
        threads: intra-op threads (default: onnxruntime's choice).
    """

    def __init__(
        self,
        source: Path | bytes,
        *,
        metadata: GraphMetadata | None = None,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
    ) -> None:
        if metadata is None:
            if not isinstance(source, Path):
                raise TypeError("metadata is required when the model is given as bytes")
            metadata = read_metadata(source)
        super().__init__(metadata)
        model = str(source) if isinstance(source, Path) else source
        self.session = ort.InferenceSession(
            model,
            sess_options=session_options(threads=threads),
            providers=list(providers or default_providers()),
        )

    def run_outputs(self, names: Sequence[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        result: list[np.ndarray] = self.session.run(list(names), feed)
        return result


def load_predictor(path: Path, device: torch.device) -> LoadedPredictor:
    """The ``.onnx`` loader of :func:`maskops.evaluation.predictor.load_predictor`."""
    try:
        metadata = read_metadata(path)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelFileError(f"{path}: {exc}") from None
    providers = default_providers() if device.type == "cuda" else ["CPUExecutionProvider"]
    threads = int(os.environ.get("MASKOPS_ORT_THREADS", "0")) or None
    predictor = OnnxPredictor(path, metadata=metadata, providers=providers, threads=threads)
    return LoadedPredictor(
        predictor=predictor, spec=metadata.spec, label_map=metadata.label_map, source=path
    )
