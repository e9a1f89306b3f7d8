"""The exported graph: a maskops Mask R-CNN as an ONNX model with fixed-size outputs.

Graph contract (the same for fp32, fp16 and int8 files):

- input ``images``: float32 ``[N, 3, H, W]``, RGB in 0..1, each image already resized
  keeping the aspect ratio and zero-padded bottom/right to the spec's ``image_size`` (H, W)
  (:func:`maskops.data.transforms.resize_and_pad`). ImageNet normalisation is *inside* the
  graph (it is elementwise, so it exports cleanly); resizing and padding are not (inside, the
  exporter bakes the example's padded size into the graph while reporting success). N is
  dynamic (``batch``, up to the metadata's ``max_batch_size``) or, exported with
  ``--static_batch_size``, fixed; files exported before batching have N fixed at 1.
- outputs, row ``i`` for image ``i``, padded to ``D = test_detections_per_image`` rows per
  image (rows past that image's ``num_detections`` are zeros): ``boxes`` float32
  ``[N, D, 4]`` xyxy in the input frame (divide by the preprocessing scale for original
  pixels); ``scores`` float32 ``[N, D]``; ``labels`` int64 ``[N, D]`` (contiguous training
  labels 1..K, see the label map in the metadata); ``masks`` float32 ``[N, D, M, M]`` mask
  probabilities over each box (M = ``mrcnn_resolution``; pasting into the image happens on
  the host); ``num_detections`` int32 ``[N, 1]``.
- a TensorRT-bound export replaces those outputs by TAO's two (``generate_detections``,
  ``mask_fcn_logits/BiasAdd``) and takes TAO's input instead of ``images``: ``Input``,
  ImageNet-normalised as TAO's nvinfer config feeds it (:mod:`maskops.export.tao_layout`);
  the metadata's ``output_layout`` and ``input_convention`` say which a file has.

:class:`DetectionGraph` is traced on one image: the legacy TorchScript exporter (the one
that exports torchvision's Mask R-CNN as is, see docs/architecture.md) unrolls
torchvision's per-image Python loops for the example's image count, so a trace cannot
take a batch of run-time size. :mod:`maskops.export.batching` then makes that graph the
body of an ONNX ``Loop`` over the batch, so an image's outputs do not depend on the other
images of its batch. Fixed per-image output sizes keep TensorRT's and DeepStream's shapes
static but for N.

The exported file carries the spec, the label map and the precision in its metadata
(``metadata_props``), so an ONNX file alone is enough to evaluate or publish it.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx
import torch
import torch.nn.functional as F
from torch import nn

from maskops.data.labels import LabelMap
from maskops.export.options import OPSET
from maskops.export.rewrite import rewrite_for_export
from maskops.spec.models import ExperimentSpec

INPUT_NAME = "images"
TAO_INPUT_NAME = "Input"
"""The input of a TAO-layout file (maskops.export.tao_layout): TAO's Mask R-CNN engine's."""
IMAGE_INPUT_NAMES: tuple[str, ...] = (INPUT_NAME, TAO_INPUT_NAME)
"""The names a maskops export's one input may have."""
OUTPUT_NAMES: tuple[str, ...] = ("boxes", "scores", "labels", "masks", "num_detections")
METADATA_FORMAT = "maskops-onnx/1"


def output_row_shapes(max_detections: int, mask_resolution: int) -> dict[str, tuple[int, ...]]:
    """Each output's shape for one image (row ``i`` of the batched output, without N):
    ``boxes [D, 4]``, ``scores [D]``, ``labels [D]``, ``masks [D, M, M]``,
    ``num_detections [1]``."""
    d, m = max_detections, mask_resolution
    return {
        "boxes": (d, 4),
        "scores": (d,),
        "labels": (d,),
        "masks": (d, m, m),
        "num_detections": (1,),
    }


class DetectionGraph(nn.Module):
    """Wraps a maskops Mask R-CNN (eval mode) into the fixed-output graph contract above."""

    def __init__(self, model: nn.Module, *, max_detections: int) -> None:
        super().__init__()
        self.model = model
        self.max_detections = max_detections

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``images`` float ``[1, 3, H, W]`` in 0..1 -> the five padded outputs (one image:
        maskops.export.batching makes the batch)."""
        out = self.model([images[0]])[0]
        boxes, scores, labels = out["boxes"], out["scores"], out["labels"]
        masks = out["masks"][:, 0]
        # The count comes from the shape so that the tracer records it as data, not a constant.
        count = torch._shape_as_tensor(scores)[:1]
        pad = self.max_detections - scores.shape[0]
        boxes = F.pad(boxes, (0, 0, 0, pad))
        scores = F.pad(scores, (0, pad))
        labels = F.pad(labels, (0, pad))
        masks = F.pad(masks, (0, 0, 0, 0, 0, pad))
        return (
            boxes[None],
            scores[None],
            labels[None],
            masks[None],
            count.to(torch.int32).reshape(1, 1),
        )


@dataclass(frozen=True)
class GraphMetadata:
    """What an exported file says about itself (stored as ONNX ``metadata_props``)."""

    spec: ExperimentSpec
    label_map: LabelMap
    data_type: str
    image_size: tuple[int, int]
    max_detections: int
    mask_resolution: int
    max_batch_size: int = 16
    """The most images one serving batch may carry (Triton's max_batch_size; the TensorRT
    profile's largest batch)."""
    batch_size: int | None = None
    """The graph's fixed batch (``--static_batch_size``; 1 for files exported before
    batching); None: dynamic up to ``max_batch_size``. Read from the graph's input shape,
    not stored in the metadata."""
    output_layout: str = "maskops"
    """The outputs' layout: "maskops" (the contract above) or "tao" (TAO's
    ``generate_detections`` / ``mask_fcn_logits/BiasAdd``, see maskops.export.tao_layout).
    Files exported before the choice existed are "maskops"."""
    input_convention: str = "maskops"
    """What the input takes: "maskops" (``images``, RGB 0..1) or
    "tao" (``Input``, TAO's nvinfer preprocessing; the TAO layout's). Files exported before
    the TAO input existed are "maskops", whatever their layout."""

    def to_props(self) -> dict[str, str]:
        return {
            "maskops_format": METADATA_FORMAT,
            "maskops_spec": json.dumps(self.spec.model_dump(mode="json")),
            "maskops_label_map": json.dumps(self.label_map.to_json()),
            "maskops_data_type": self.data_type,
            "maskops_image_size": json.dumps(list(self.image_size)),
            "maskops_max_detections": str(self.max_detections),
            "maskops_mask_resolution": str(self.mask_resolution),
            "maskops_max_batch_size": str(self.max_batch_size),
            "maskops_output_layout": self.output_layout,
            "maskops_input_convention": self.input_convention,
        }

    @classmethod
    def from_props(cls, props: dict[str, str], *, source: str) -> GraphMetadata:
        if props.get("maskops_format") != METADATA_FORMAT:
            raise ValueError(f"{source}: not a maskops ONNX export (no {METADATA_FORMAT} metadata)")
        height, width = json.loads(props["maskops_image_size"])
        return cls(
            spec=ExperimentSpec.model_validate(json.loads(props["maskops_spec"])),
            label_map=LabelMap.from_json(json.loads(props["maskops_label_map"])),
            data_type=props["maskops_data_type"],
            image_size=(int(height), int(width)),
            max_detections=int(props["maskops_max_detections"]),
            mask_resolution=int(props["maskops_mask_resolution"]),
            max_batch_size=int(props.get("maskops_max_batch_size", "16")),
            output_layout=props.get("maskops_output_layout", "maskops"),
            input_convention=props.get("maskops_input_convention", "maskops"),
        )


def set_metadata(model: onnx.ModelProto, metadata: GraphMetadata) -> None:
    """Replace the maskops entries of ``model.metadata_props`` with ``metadata``."""
    props = metadata.to_props()
    keep = [p for p in model.metadata_props if p.key not in props]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)


def read_metadata(path: Path) -> GraphMetadata:
    """The maskops metadata of an exported ONNX file (weights are not loaded)."""
    model = onnx.load(str(path), load_external_data=False)
    metadata = GraphMetadata.from_props(
        {p.key: p.value for p in model.metadata_props}, source=str(path)
    )
    return replace(metadata, batch_size=graph_batch_size(model))


def image_input(model: onnx.ModelProto) -> onnx.ValueInfoProto:
    """A maskops graph's image input: ``images``, or ``Input`` in a TAO-layout file.

    Raises:
        ValueError: the graph has neither.
    """
    for value in model.graph.input:
        if value.name in IMAGE_INPUT_NAMES:
            return value
    raise ValueError(f"no '{INPUT_NAME}' or '{TAO_INPUT_NAME}' input: not a maskops export")


def graph_batch_size(model: onnx.ModelProto) -> int | None:
    """The fixed first dimension of a maskops graph's image input; None when dynamic."""
    first = image_input(model).type.tensor_type.shape.dim[0]
    return int(first.dim_value) if first.HasField("dim_value") else None


def trace_to_onnx(
    model: nn.Module,
    *,
    image_size: tuple[int, int],
    max_detections: int,
    example: torch.Tensor | None = None,
    opset: int = OPSET,
) -> onnx.ModelProto:
    """Export ``model`` (eval mode, CPU) to an in-memory fp32 ONNX model of the graph contract.

    Args:
        model: maskops Mask R-CNN; its eval output follows the modeling contract.
        image_size: (H, W) of the ``images`` input.
        max_detections: D, the padded output length (>= the model's detections per image).
        example: ``[1, 3, H, W]`` tracing input; real images trace the same graph as noise
            but keep the tracer's shape-dependent branches honest, so pass one when you can.
        opset: the ONNX opset to write (MIN_OPSET..MAX_OPSET).
    """
    graph = DetectionGraph(rewrite_for_export(model.eval()), max_detections=max_detections).eval()
    if example is None:
        example = torch.rand(1, 3, *image_size, generator=torch.Generator().manual_seed(0))
    with (
        tempfile.TemporaryDirectory(prefix="maskops-export-") as tmp,
        warnings.catch_warnings(),
        torch.no_grad(),
    ):
        # The tracer warns about every Python int it records; the graph is checked by parity.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            (example,),
            f"{tmp}/model.onnx",
            dynamo=False,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=list(OUTPUT_NAMES),
            do_constant_folding=True,
        )
        exported = onnx.load(f"{tmp}/model.onnx")
    read_initializers_directly(exported.graph)
    return exported


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds (a Loop's body, an If's branches)."""
    return [g for attr in node.attribute for g in ([attr.g] if attr.HasField("g") else attr.graphs)]


def used_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name a graph's nodes read, subgraphs (Loop/If bodies) included."""
    used: set[str] = set()
    for node in graph.node:
        used.update(node.input)
        for sub in subgraphs(node):
            used |= used_names(sub)
    return used


def read_initializers_directly(graph: onnx.GraphProto) -> None:
    """Make nodes read initializers directly where the exporter put an Identity between.

    torch.onnx stores equal-valued parameters once and gives the others an Identity of it
    (the export-time mask predictor has four copies of one bias, see
    maskops.export.rewrite). Tools that look for a layer's weights among the initializers
    (the fp16 conversion, onnxruntime's quantiser, TensorRT's refitting) would skip those
    layers.
    """
    initializers = {init.name for init in graph.initializer}
    aliases = {
        node.output[0]: node.input[0]
        for node in graph.node
        if node.op_type == "Identity" and node.input[0] in initializers
    }
    if not aliases:
        return
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name in aliases:
                node.input[position] = aliases[name]
    # Identities still read (by a subgraph or as a graph output) stay.
    read = used_names(graph) | {value.name for value in graph.output}
    kept = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] not in read)]
    del graph.node[:]
    graph.node.extend(kept)


def describe_io(model: onnx.ModelProto) -> dict[str, Any]:
    """Names, element types and shapes of the graph's inputs and outputs (for reports)."""

    def shape(value: onnx.ValueInfoProto) -> list[int | str]:
        dims = value.type.tensor_type.shape.dim
        return [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in dims]

    def entry(value: onnx.ValueInfoProto) -> dict[str, Any]:
        elem = onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type).lower()
        return {"name": value.name, "dtype": elem, "shape": shape(value)}

    return {
        "inputs": [entry(v) for v in model.graph.input],
        "outputs": [entry(v) for v in model.graph.output],
    }
