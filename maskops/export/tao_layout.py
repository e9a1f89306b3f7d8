"""TAO's Mask R-CNN input and output layout, the ones DeepStream's TAO configs feed and parse.

A TAO 5.3 Mask R-CNN engine takes ``Input`` preprocessed by nvinfer with TAO's keys and
has two outputs, which DeepStream parses with ``NvDsInferParseCustomMrcnnTLTV2``
(``libnvds_infercustomparser.so``). :func:`to_tao_layout` prepends two ONNX nodes to a
batched maskops graph (:mod:`maskops.export.graph`'s ``images`` input and five outputs,
made by :mod:`maskops.export.batching`) and appends others after it, so that its input and
outputs are exactly TAO's; the traced graph and the Loop are not touched.

The input, ``Input`` float32 ``[N, 3, H, W]``: what nvinfer computes with TAO's
``pgie_peopleSegNet_tao_config.txt`` / ``dsmrcnn_pgie_config.txt`` keys
(``net-scale-factor=0.017507``, ``offsets=123.675;116.280;103.53``, ``model-color-format=0``):
``y_c = s * (x_c - o_c)`` per RGB channel c, x the scaled frame's pixel in 0..255, s
:data:`TAO_NET_SCALE_FACTOR`, o :data:`TAO_OFFSETS`. Two nodes, ``Mul`` and ``Add`` by
constant ``[1, 3, 1, 1]`` tensors, map it back to maskops' input::

    in_c = y_c * (1 / (255 s)) + o_c / 255
         = (x_c - o_c) / 255 + o_c / 255 = x_c / 255

whatever s and o are (both cancel): maskops' RGB 0..1 pixel, which the graph's own
normalisation turns into ``(x_c / 255 - m_c) / sd_c = (x_c - 255 m_c) / (255 sd_c)``, m and
sd being ImageNet's per-channel mean and std (maskops.modeling.transform). TAO's offsets are
``255 m`` (123.675 = 255 * 0.485, ...), so that is ``(x_c - o_c) / (255 sd_c)``: exactly
the per-channel normalisation maskops was trained with, not TAO's single scale
0.017507 ~ 1 / (255 * 0.224). nvinfer pads a frame it scales keeping the aspect ratio with
black, x = 0, before normalising (gst-nvinfer ``get_converted_buffer``), so a padding
pixel arrives as ``y_c = -s o_c`` and leaves as ``in_c = 0``: maskops' zero padding
(maskops.data.transforms.resize_and_pad). In float32 the round trip lands within 6e-8 of
x / 255 for every pixel value 0..255 (half float32's spacing at 1), and padding on 0
exactly. :func:`tao_input` computes ``y`` from maskops' 0..1 images, as nvinfer does from
pixels.

The outputs:

- ``generate_detections`` float32 ``[N, D, 6]``: per row ``y1, x1, y2, x2, class_id,
  score``; the box in pixels of the network input (the parser clips it to
  ``[0, width-1]`` x ``[0, height-1]`` and never scales it), ``class_id`` the training
  label as a float (background 0, categories 1..K: the line of ``labels.txt`` and the mask
  channel; the parser does not subtract 1). Rows past an image's detections are zeros
  (score 0, empty box), which the parser skips.
- ``mask_fcn_logits/BiasAdd`` float32 ``[N, D, C, M, M]``: C = the model's classes,
  background included (nvinfer's ``num-detected-classes``; TAO's ``num_classes``). Row i
  channel ``class_id`` holds the mask *logits* of detection i, ``log(p / (1 - p))`` of the
  maskops probability p (clipped to ``[LOGIT_EPS, 1 - LOGIT_EPS]`` so that padding rows,
  p = 0, stay finite). Every other channel holds ``FILL_LOGIT`` (probability LOGIT_EPS).

What the parser does with them (DeepStream ``sources/libs/nvdsinfer_customparser/
nvdsinfer_custombboxparser.cpp``, mirrored in NVIDIA-AI-IOT/deepstream_tao_apps
``post_processor/nvdsinfer_custombboxparser_tao.cpp``): it finds both layers by name and
requires them FLOAT; the mask layer's dims without the batch must be 4 (D, C, M, M) and
``D = d[0]`` is the number of rows it reads from ``generate_detections`` (there is no count
output). Each row whose score reaches ``pre-cluster-threshold`` and whose clipped box is
non-empty becomes an object of class ``int(class_id)``; its mask is the M x M floats at
``mask + (i * num-detected-classes + class_id) * M * M``, copied as they are (no sigmoid).
So only the detected class's channel is read, which is why the other channels may hold
anything; nvinfer then drops objects whose class is ``>= num-detected-classes``
(``nvdsinfer_context_impl_output_parsing.cpp``, ``preClusteringThreshold``) and sets the
mask's threshold to ``segmentation-threshold`` (default 0; DeepStream's mask consumers keep a
pixel when its value reaches it). TAO's engine writes logits there (the ``mask_fcn_logits``
convolution has no activation; TAO's sigmoid comes after the exported node: NVIDIA
tao_tensorflow1_backend ``nvidia_tao_tf1/cv/mask_rcnn/export/exporter.py`` exports
``mask_fcn_logits/BiasAdd``), so a threshold of 0 means probability 0.5, maskops' own mask
threshold. NVIDIA/tao_deploy ``nvidia_tao_deploy/cv/mask_rcnn/inferencer.py`` reads the
same two outputs in the same layout ([N, D, 6] with the class in column 4, masks picked by
class).

Only ops TensorRT's ONNX parser takes natively are added (Mul, Add, Reshape, Gather, Cast,
Concat, Clip, Sub, Div, Log, Equal, Where), and every non-batch dimension is a constant of
the graph, so the engine's D, C and M are static as nvinfer needs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from maskops.export.graph import INPUT_NAME, OUTPUT_NAMES, TAO_INPUT_NAME
from maskops.export.options import OUTPUT_LAYOUTS

TAO_NET_SCALE_FACTOR = 0.017507
"""nvinfer's ``net-scale-factor`` in TAO's Mask R-CNN configs (one scale for all channels)."""
TAO_OFFSETS: tuple[float, float, float] = (123.675, 116.28, 103.53)
"""nvinfer's ``offsets`` (R, G, B) in TAO's Mask R-CNN configs: ImageNet's mean x 255."""
TAO_COLOR_FORMAT = 0
"""nvinfer's ``model-color-format`` in TAO's Mask R-CNN configs: RGB."""
DETECTIONS = "generate_detections"
MASK_LOGITS = "mask_fcn_logits/BiasAdd"
TAO_OUTPUT_NAMES: tuple[str, ...] = (DETECTIONS, MASK_LOGITS)
"""The TAO layout's outputs, in nvinfer's ``output-blob-names`` order."""
DETECTION_COLUMNS: tuple[str, ...] = ("y1", "x1", "y2", "x2", "class_id", "score")
"""``generate_detections``' columns (the parser's ``MrcnnRawDetection``)."""
LOGIT_EPS = 1e-6
FILL_LOGIT = math.log(LOGIT_EPS / (1.0 - LOGIT_EPS))
"""The logit of the mask channels no detection reads (about -13.8)."""
_PREFIX = "tao_layout/"


def _const(name: str, values: np.ndarray) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(values, name=_PREFIX + name)
    return helper.make_node("Constant", [], [_PREFIX + name], name=_PREFIX + name, value=tensor)


def _node(op: str, inputs: list[str], output: str, **attrs: Any) -> onnx.NodeProto:
    """A node whose output (and name) is ``output``, prefixed unless it is a final output."""
    name = output if output in TAO_OUTPUT_NAMES else _PREFIX + output
    return helper.make_node(op, inputs, [name], name=name, **attrs)


def _input_nodes() -> list[onnx.NodeProto]:
    """``Input`` (TAO's nvinfer preprocessing) -> ``images`` (maskops' 0..1; module doc)."""
    scale = np.full((1, 3, 1, 1), 1.0 / (255.0 * TAO_NET_SCALE_FACTOR), np.float32)
    bias = (np.array(TAO_OFFSETS, np.float64) / 255.0).astype(np.float32).reshape(1, 3, 1, 1)
    return [
        _const("input/scale", scale),
        _const("input/bias", bias),
        _node("Mul", [TAO_INPUT_NAME, _PREFIX + "input/scale"], "input/scaled"),
        helper.make_node(
            "Add",
            [_PREFIX + "input/scaled", _PREFIX + "input/bias"],
            [INPUT_NAME],
            name=_PREFIX + "input/to_images",
        ),
    ]


def tao_input(images: np.ndarray) -> np.ndarray:
    """What nvinfer feeds a TAO-layout graph, with TAO's keys, for maskops' input.

    Args:
        images: ``[N, 3, H, W]`` RGB in 0..1 (maskops' ``images``: ``pixel / 255``).

    Returns:
        float32 ``TAO_NET_SCALE_FACTOR * (255 * images - TAO_OFFSETS)`` per channel.
    """
    pixels = images.astype(np.float32) * np.float32(255.0)
    offsets = np.asarray(TAO_OFFSETS, np.float32).reshape(1, 3, 1, 1)
    result: np.ndarray = np.float32(TAO_NET_SCALE_FACTOR) * (pixels - offsets)
    return result


def _layout_nodes(num_classes: int, detections: int, resolution: int) -> list[onnx.NodeProto]:
    """The nodes from the maskops outputs to the two TAO outputs (see the module doc)."""
    p = _PREFIX
    d, c, m = detections, num_classes, resolution
    shape = {
        "rows": np.array([-1, d, 4], np.int64),
        "column": np.array([-1, d, 1], np.int64),
        "masks": np.array([-1, d, 1, m, m], np.int64),
        "channel": np.array([-1, d, 1, 1, 1], np.int64),
    }
    return [
        *(_const(f"shape/{key}", value) for key, value in shape.items()),
        _const("yxyx", np.array([1, 0, 3, 2], np.int64)),
        _const("classes", np.arange(c, dtype=np.float32).reshape(1, 1, c, 1, 1)),
        _const("eps", np.array(LOGIT_EPS, np.float32)),
        _const("one_minus_eps", np.array(1.0 - LOGIT_EPS, np.float32)),
        _const("one", np.array(1.0, np.float32)),
        _const("fill", np.array(FILL_LOGIT, np.float32)),
        # generate_detections: [y1, x1, y2, x2] | class | score.
        _node("Reshape", ["boxes", p + "shape/rows"], "boxes"),
        _node("Gather", [p + "boxes", p + "yxyx"], "yxyx_boxes", axis=2),
        _node("Cast", ["labels"], "labels_float", to=TensorProto.FLOAT),
        _node("Reshape", [p + "labels_float", p + "shape/column"], "class_column"),
        _node("Reshape", ["scores", p + "shape/column"], "score_column"),
        _node(
            "Concat",
            [p + "yxyx_boxes", p + "class_column", p + "score_column"],
            DETECTIONS,
            axis=2,
        ),
        # mask_fcn_logits/BiasAdd: the detection's logits in its class's channel.
        _node("Reshape", ["masks", p + "shape/masks"], "masks"),
        _node("Clip", [p + "masks", p + "eps", p + "one_minus_eps"], "probabilities"),
        _node("Sub", [p + "one", p + "probabilities"], "complement"),
        _node("Div", [p + "probabilities", p + "complement"], "odds"),
        _node("Log", [p + "odds"], "logits"),
        _node("Reshape", [p + "labels_float", p + "shape/channel"], "class_of_row"),
        _node("Equal", [p + "class_of_row", p + "classes"], "is_class"),
        _node("Where", [p + "is_class", p + "logits", p + "fill"], MASK_LOGITS),
    ]


def to_tao_layout(
    model: onnx.ModelProto, *, num_classes: int, max_detections: int, mask_resolution: int
) -> onnx.ModelProto:
    """``model`` (a batched maskops graph) with TAO's input and two outputs instead of its
    ``images`` and five outputs.

    Args:
        model: input ``images [N, 3, H, W]`` RGB 0..1; outputs ``boxes [N, D, 4]`` xyxy,
            ``scores [N, D]``, ``labels [N, D]`` int64, ``masks [N, D, M, M]``
            probabilities, ``num_detections [N, 1]``.
        num_classes: C, the model's classes with background (the mask channels).
        max_detections: D. mask_resolution: M.

    Returns:
        A new model (``model`` is not modified) whose input is ``Input [N, 3, H, W]``
        float32 preprocessed as TAO's nvinfer config does (module doc) and whose outputs
        are ``generate_detections [N, D, 6]`` and ``mask_fcn_logits/BiasAdd [N, D, C, M,
        M]``, both float32, with the same metadata and opset; N stays as the input's first
        dimension.
    """
    names = [value.name for value in model.graph.output]
    if names != list(OUTPUT_NAMES):
        raise ValueError(f"expected the maskops outputs {list(OUTPUT_NAMES)}, got {names}")
    inputs = [value.name for value in model.graph.input]
    if inputs != [INPUT_NAME]:
        raise ValueError(f"expected the maskops input {INPUT_NAME!r} alone, got {inputs}")
    batch = model.graph.output[0].type.tensor_type.shape.dim[0]
    first: int | str = batch.dim_value if batch.HasField("dim_value") else batch.dim_param
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.input[0].name = TAO_INPUT_NAME
    nodes = [*_input_nodes(), *out.graph.node]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.node.extend(_layout_nodes(num_classes, max_detections, mask_resolution))
    del out.graph.output[:]
    out.graph.output.extend(
        [
            helper.make_tensor_value_info(
                DETECTIONS, TensorProto.FLOAT, [first, max_detections, len(DETECTION_COLUMNS)]
            ),
            helper.make_tensor_value_info(
                MASK_LOGITS,
                TensorProto.FLOAT,
                [first, max_detections, num_classes, mask_resolution, mask_resolution],
            ),
        ]
    )
    return out


def tao_layout_problems(
    model: onnx.ModelProto, *, num_classes: int, max_detections: int, mask_resolution: int
) -> list[str]:
    """How ``model``'s outputs differ from what DeepStream's TAO Mask R-CNN parser and the
    generated nvinfer config expect; empty when they do not. Each problem names the output.

    Checked: exactly the outputs ``generate_detections`` and ``mask_fcn_logits/BiasAdd``,
    float32 (the parser looks each up by name and FLOAT type), of rank 3 ``[N, D, 6]`` and
    rank 5 ``[N, D, C, M, M]`` with D, C, M static and equal to the export's (nvinfer
    needs static dims but for the batch; the parser indexes masks by
    ``num-detected-classes`` = C); both as declared and as ONNX shape inference computes
    them from the nodes. And the input: ``Input`` alone, float32 ``[N, 3, H, W]`` with H
    and W static (nvinfer's ``infer-dims``), which TAO's nvinfer preprocessing feeds.
    """
    expected = {
        DETECTIONS: (max_detections, len(DETECTION_COLUMNS)),
        MASK_LOGITS: (max_detections, num_classes, mask_resolution, mask_resolution),
    }
    declared = {value.name: value for value in model.graph.output}
    computed = _computed_outputs(model)
    problems = _input_problems(model)
    problems += [
        f"{name}: an output DeepStream's NvDsInferParseCustomMrcnnTLTV2 does not read "
        f"(TAO's engine has only {', '.join(TAO_OUTPUT_NAMES)})"
        for name in declared
        if name not in expected
    ]
    for name, dims in expected.items():
        if name not in declared:
            problems.append(f"{name}: missing (the parser looks the output up by this name)")
            continue
        found = _output_problems(name, _type_and_shape(declared[name]), dims, "declared")
        if not found and name in computed:
            found = _output_problems(name, computed[name], dims, "computed by the graph")
        problems.extend(found)
    return problems


TypeAndShape = tuple[int, list[int | str]]


def _type_and_shape(value: onnx.ValueInfoProto) -> TypeAndShape:
    tensor = value.type.tensor_type
    dims = [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim
    ]
    return tensor.elem_type, dims


def _input_problems(model: onnx.ModelProto) -> list[str]:
    """The graph's inputs against TAO's ``Input`` float32 ``[N, 3, H, W]`` (H, W static)."""
    names = [value.name for value in model.graph.input]
    if names != [TAO_INPUT_NAME]:
        return [
            f"inputs {names}: expected {TAO_INPUT_NAME!r} alone (TAO's engine input, fed "
            "with TAO's preprocessing)"
        ]
    elem_type, dims = _type_and_shape(model.graph.input[0])
    problems = []
    if elem_type != TensorProto.FLOAT:
        kind = TensorProto.DataType.Name(elem_type)
        problems.append(f"{TAO_INPUT_NAME}: element type {kind}, nvinfer feeds FLOAT")
    if len(dims) != 4 or dims[1] != 3 or not all(isinstance(d, int) and d for d in dims[2:]):
        problems.append(f"{TAO_INPUT_NAME}: shape {dims}, expected [N, 3, H, W] with static H, W")
    return problems


def _computed_outputs(model: onnx.ModelProto) -> dict[str, TypeAndShape]:
    """The outputs' element types and shapes as ONNX shape inference derives them from the
    nodes (the declared ones removed first, so that they do not stand in for the result)."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    for value in bare.graph.output:
        value.ClearField("type")
    inferred = onnx.shape_inference.infer_shapes(bare).graph.output
    return {value.name: _type_and_shape(value) for value in inferred if value.HasField("type")}


def _output_problems(name: str, found: TypeAndShape, dims: tuple[int, ...], how: str) -> list[str]:
    """One output (its element type and shape) against ``[N, *dims]`` float32."""
    elem_type, got = found
    want = ["N", *dims]
    problems = []
    if elem_type != TensorProto.FLOAT:
        kind = TensorProto.DataType.Name(elem_type)
        problems.append(f"{name}: element type {kind} ({how}), the parser reads FLOAT only")
    if len(got) != len(want):
        problems.append(f"{name}: shape {got} ({how}), expected rank {len(want)} {want}")
        return problems
    for axis, (size, wanted) in enumerate(zip(got[1:], dims, strict=True), start=1):
        if size != wanted:
            problems.append(
                f"{name}: dimension {axis} is {size} ({how}), expected the static {wanted} "
                f"(shape {want})"
            )
    return problems


def decode_tao_outputs(detections: np.ndarray, mask_logits: np.ndarray) -> list[np.ndarray]:
    """The maskops outputs back from the TAO ones (for ``maskops evaluate`` and the export's
    parity check on a TAO-layout file).

    Args:
        detections: ``[N, D, 6]`` ``generate_detections``.
        mask_logits: ``[N, D, C, M, M]`` ``mask_fcn_logits/BiasAdd``.

    Returns:
        ``[boxes [N, D, 4] xyxy, scores [N, D], labels [N, D] int64, masks [N, D, M, M]
        probabilities, num_detections [N, 1] int32]``; a row counts as a detection when its
        score is above 0 (maskops' rows are sorted by score and padded with zeros).
    """
    boxes = detections[..., [1, 0, 3, 2]]
    labels = np.rint(detections[..., 4]).astype(np.int64)
    scores = detections[..., 5]
    picked = np.take_along_axis(mask_logits, labels[:, :, None, None, None], axis=2)[:, :, 0]
    masks = 1.0 / (1.0 + np.exp(-picked.astype(np.float64)))
    count = (scores > 0).sum(axis=1, keepdims=True).astype(np.int32)
    return [boxes, scores, labels, masks.astype(np.float32), count]


def choose_output_layout(requested: str | None, *, engine: bool, gen_ds_config: bool) -> str:
    """The export's output layout: ``requested``, else ``tao`` for a TensorRT-bound export
    (an engine file or DeepStream files requested), else ``maskops`` (the portable layout
    onnxruntime and the Triton ensemble serve).

    Raises:
        ValueError: an unknown layout, or DeepStream files for the maskops layout (no
            DeepStream parser reads it).
    """
    if requested is not None and requested not in OUTPUT_LAYOUTS:
        raise ValueError(
            f"--output_layout {requested!r}: expected one of {', '.join(OUTPUT_LAYOUTS)}"
        )
    layout = requested or ("tao" if engine or gen_ds_config else "maskops")
    if gen_ds_config and layout != "tao":
        raise ValueError(
            "--gen_ds_config writes a DeepStream config for the TAO output layout only: no "
            "DeepStream parser reads maskops' boxes/scores/labels/masks/num_detections; "
            "export with --output_layout tao (or leave --output_layout out)"
        )
    return layout
