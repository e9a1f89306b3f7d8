"""TAO's layout: what DeepStream's NvDsInferParseCustomMrcnnTLTV2 reads from it is what the
maskops layout says, on frames nvinfer preprocesses with TAO's keys; the layout check, the
metadata and the DeepStream config."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper

from maskops.checkpoints.model_file import load_model
from maskops.data.labels import LabelMap
from maskops.data.transforms import resize_and_pad
from maskops.export import OUTPUT_NAMES, ExportError, export_onnx, read_metadata
from maskops.export.batching import batch_over_images
from maskops.export.deepstream import PARSE_FUNCTION, PARSER_LIBRARY
from maskops.export.graph import GraphMetadata, output_row_shapes, trace_to_onnx
from maskops.export.tao_layout import (
    FILL_LOGIT,
    TAO_OFFSETS,
    TAO_OUTPUT_NAMES,
    choose_output_layout,
    tao_input,
    tao_layout_problems,
    to_tao_layout,
)
from maskops.export.tensorrt import BatchProfile, build_engine
from maskops.modeling import build_model
from maskops.modeling.transform import IMAGENET_MEAN
from maskops.spec.models import ExperimentSpec, MaskRCNNConfig
from tests.support.gpu import needs_tensorrt

SIZE = (64, 64)
DETECTIONS = 12
"""Rows per image; the model keeps at most 10 boxes, so the last rows are padding."""
CLASSES = 4
RESOLUTION = 28


@dataclass(frozen=True)
class ParsedObject:
    """One ``NvDsInferInstanceMaskInfo`` as the parser fills it."""

    left: float
    top: float
    width: float
    height: float
    class_id: int
    score: float
    mask: np.ndarray


def parse_mrcnn_tlt_v2(
    detections: np.ndarray,
    mask_layer: np.ndarray,
    *,
    width: int,
    height: int,
    num_classes_configured: int,
    threshold: float,
) -> list[ParsedObject]:
    """DeepStream's ``NvDsInferParseCustomMrcnnTLTV2`` on one frame, then nvinfer's
    ``preClusteringThreshold``, line by line (sources/libs/nvdsinfer_customparser/
    nvdsinfer_custombboxparser.cpp; nvdsinfer_context_impl_output_parsing.cpp).

    ``detections``: the frame's ``generate_detections`` buffer ``[D, 6]``; ``mask_layer``:
    its ``mask_fcn_logits/BiasAdd`` buffer, inferDims ``[D, C, M, M]``.
    """
    assert detections.dtype == np.float32 and mask_layer.dtype == np.float32  # FLOAT layers
    assert mask_layer.ndim == 4  # inferDims.numDims == 4
    det_max_instances, _, mask_h, mask_w = mask_layer.shape
    out_mask = mask_layer.reshape(-1, mask_h * mask_w)  # float (*)[w * h]
    out_det = detections.reshape(-1, 6)  # MrcnnRawDetection: y1, x1, y2, x2, class_id, score

    def clip(value: np.float32, high: int) -> np.float32:
        return np.float32(max(min(value, np.float32(high)), np.float32(0)))

    objects = []
    for i in range(det_max_instances):
        y1, x1, y2, x2, class_id, score = out_det[i]
        if score < threshold:  # perClassPreclusterThreshold[0]
            continue
        obj_width = clip(x2, width - 1) - x1
        obj_height = clip(y2, height - 1) - y1
        if obj_width <= 0 or obj_height <= 0:
            continue
        cls = int(class_id)  # static_cast<int>
        raw = out_mask[i * num_classes_configured + cls]
        objects.append(
            ParsedObject(
                left=float(clip(x1, width - 1)),
                top=float(clip(y1, height - 1)),
                width=float(obj_width),
                height=float(obj_height),
                class_id=cls,
                score=float(score),
                mask=raw.reshape(mask_h, mask_w).copy(),
            )
        )
    # nvinfer drops classes it is not configured for and applies the per-class threshold.
    return [o for o in objects if o.class_id < num_classes_configured and o.score >= threshold]


def expected_objects(
    maskops: list[np.ndarray], index: int, *, width: int, height: int, threshold: float
) -> list[ParsedObject]:
    """Image ``index``'s detections in the maskops layout, as the parser should report
    them (its box clipping applied to the maskops boxes)."""
    boxes, scores, labels, masks, count = (output[index] for output in maskops)
    objects = []
    for j in range(int(count[0])):
        x1, y1, x2, y2 = (np.float32(v) for v in boxes[j])
        w = np.float32(min(x2, np.float32(width - 1))) - x1
        h = np.float32(min(y2, np.float32(height - 1))) - y1
        if scores[j] < threshold or w <= 0 or h <= 0:
            continue
        left = float(np.clip(x1, 0, width - 1))
        top = float(np.clip(y1, 0, height - 1))
        objects.append(
            ParsedObject(left, top, float(w), float(h), int(labels[j]), float(scores[j]), masks[j])
        )
    return objects


def assert_same_objects(parsed: list[ParsedObject], want: list[ParsedObject]) -> None:
    assert [(o.class_id, o.score) for o in parsed] == [(o.class_id, o.score) for o in want]
    for got, expected in zip(parsed, want, strict=True):
        box = (got.left, got.top, got.width, got.height)
        assert box == (expected.left, expected.top, expected.width, expected.height)
        # The parser hands over logits; DeepStream keeps pixels >= segmentation-threshold 0.
        probabilities = 1.0 / (1.0 + np.exp(-got.mask.astype(np.float64)))
        np.testing.assert_allclose(probabilities, expected.mask, atol=2e-6)
        decided = np.abs(expected.mask - 0.5) > 1e-5
        assert np.array_equal((got.mask >= 0)[decided], (expected.mask >= 0.5)[decided])


@pytest.fixture(scope="module")
def maskops_graph() -> onnx.ModelProto:
    """A random resnet10 of 4 classes keeping its 10 best boxes whatever their score
    (score threshold 0), batched."""
    torch.manual_seed(0)
    config = MaskRCNNConfig(nlayers=10, min_level=3, max_level=5, test_detections_per_image=10)
    model = build_model(config, num_classes=CLASSES, image_size=SIZE).eval()
    model.roi_heads.score_thresh = 0.0
    single = trace_to_onnx(model, image_size=SIZE, max_detections=DETECTIONS)
    return batch_over_images(single, row_shapes=output_row_shapes(DETECTIONS, RESOLUTION))


@pytest.fixture(scope="module")
def tao_graph(maskops_graph: onnx.ModelProto) -> onnx.ModelProto:
    sizes = {"max_detections": DETECTIONS, "mask_resolution": RESOLUTION}
    return to_tao_layout(maskops_graph, num_classes=CLASSES, **sizes)


TAO_SCALE = 0.017507
"""net-scale-factor of TAO's Mask R-CNN nvinfer configs (deepstream_tao_apps'
pgie_peopleSegNet_tao_config.txt, DeepStream's dsmrcnn_pgie_config.txt)."""
TAO_CONFIG_OFFSETS = np.array([123.675, 116.280, 103.53], np.float32)
"""Their offsets (model-color-format=0: R, G, B)."""


def _run(model: onnx.ModelProto, names: tuple[str, ...], images: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (name,) = [value.name for value in model.graph.input]
    result: list[np.ndarray] = session.run(list(names), {name: images})
    return result


def _prepended(tao: onnx.ModelProto, maskops: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes the TAO layout puts before the maskops graph's (which follow unchanged)."""
    count = len(tao.graph.node) - len(maskops.graph.node)
    for start in range(count + 1):
        if tao.graph.node[start : start + len(maskops.graph.node)] == maskops.graph.node:
            return list(tao.graph.node[:start])
    raise AssertionError("the maskops graph's nodes are not kept in order")


def test_the_parser_reads_the_maskops_detections(maskops_graph, tao_graph):
    onnx.checker.check_model(tao_graph, full_check=True)
    assert [o.name for o in tao_graph.graph.output] == list(TAO_OUTPUT_NAMES)
    assert [i.name for i in tao_graph.graph.input] == ["Input"]  # TAO's engine input
    assert len(tao_graph.graph.node) > len(maskops_graph.graph.node)  # added, not rebuilt
    # Prepended: Mul and Add by [1, 3, 1, 1] constants, from Input to the graph's images.
    prepended = _prepended(tao_graph, maskops_graph)
    ops = [n.op_type for n in prepended if n.op_type != "Constant"]
    assert ops == ["Mul", "Add"] and prepended[-1].output[0] == "images"
    constants = [numpy_helper.to_array(n.attribute[0].t) for n in prepended[:2]]
    assert [c.shape for c in constants] == [(1, 3, 1, 1)] * 2
    scale, bias = (c.reshape(3) for c in constants)
    pixels = np.random.default_rng(1).integers(0, 256, (2, 3, *SIZE)).astype(np.float32)
    images = pixels / np.float32(255)
    tao = tao_input(images)
    # The two nodes give back maskops' input, pixel / 255, up to float32 rounding.
    seen = tao * scale[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(seen, images, rtol=0, atol=1e-6)
    maskops = _run(maskops_graph, OUTPUT_NAMES, seen)  # what the graph after them sees
    detections, mask_logits = _run(tao_graph, TAO_OUTPUT_NAMES, tao)
    assert detections.shape == (2, DETECTIONS, 6)
    assert mask_logits.shape == (2, DETECTIONS, CLASSES, RESOLUTION, RESOLUTION)
    labels = maskops[2]
    assert len(np.unique(labels[maskops[1] > 0])) > 1  # several classes: channels are tested
    for image in range(2):
        assert 0 < int(maskops[4][image, 0]) < DETECTIONS  # real rows and padding rows
        for threshold in (0.0, 0.26):
            width, height = SIZE[1], SIZE[0]
            parsed = parse_mrcnn_tlt_v2(
                detections[image],
                mask_logits[image],
                width=width,
                height=height,
                num_classes_configured=CLASSES,
                threshold=threshold,
            )
            want = expected_objects(maskops, image, width=width, height=height, threshold=threshold)
            assert want
            assert_same_objects(parsed, want)
    # Channels no detection reads hold the fill value (the parser never looks at them).
    others = np.arange(CLASSES)[None, None, :] != labels[:, :, None]
    assert np.all(mask_logits[others] == np.float32(FILL_LOGIT))


def nvinfer_scaled_size(height: int, width: int, net: tuple[int, int]) -> tuple[int, int]:
    """The (height, width) gst-nvinfer scales a frame to with maintain-aspect-ratio=1
    (``get_converted_buffer``: the other side is truncated to an integer)."""
    hdest = net[1] * height / width
    if hdest <= net[0]:
        return int(hdest), net[1]
    return net[0], int(net[0] * width / height)


def nvinfer_tao_input(frames: list[torch.Tensor]) -> np.ndarray:
    """``[N, 3, H, W]`` float32 as nvinfer makes it from uint8 RGB frames with TAO's keys and
    maintain-aspect-ratio=1, symmetric-padding=0: scale keeping the aspect ratio into a
    black network-size buffer at its top-left, then ``net-scale-factor * (x - offsets)``.

    The bilinear kernel is maskops' (resize_and_pad's), not NvBufSurfTransform's, so that
    both paths see the same pixels and the comparison is about the input convention.
    """
    batch = np.zeros((len(frames), 3, *SIZE), np.float32)  # black padding, x = 0
    for index, frame in enumerate(frames):
        height, width = nvinfer_scaled_size(frame.shape[1], frame.shape[2], SIZE)
        scaled = F.interpolate(
            frame[None], size=(height, width), mode="bilinear", align_corners=False, antialias=True
        )[0]
        batch[index, :, :height, :width] = scaled.numpy()
    result: np.ndarray = np.float32(TAO_SCALE) * (batch - TAO_CONFIG_OFFSETS[:, None, None])
    return result


def assert_close_objects(parsed: list[ParsedObject], want: list[ParsedObject]) -> None:
    """The same detections in the same order, up to float32 rounding of the input."""
    assert [o.class_id for o in parsed] == [o.class_id for o in want]
    for got, expected in zip(parsed, want, strict=True):
        assert got.score == pytest.approx(expected.score, abs=1e-5)
        box = (got.left, got.top, got.width, got.height)
        assert box == pytest.approx(
            (expected.left, expected.top, expected.width, expected.height), abs=1e-3
        )
        probabilities = 1.0 / (1.0 + np.exp(-got.mask.astype(np.float64)))
        np.testing.assert_allclose(probabilities, expected.mask, atol=1e-4)


def test_a_frame_preprocessed_with_taos_keys_gives_maskops_detections(maskops_graph, tao_graph):
    # A tall frame (padded on the right) and a wide one (padded at the bottom), uint8 RGB.
    rng = np.random.default_rng(7)
    frames = [
        torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8))
        for h, w in ((40, 32), (24, 48))
    ]
    tao = nvinfer_tao_input(frames)
    # maskops' own path: resize_and_pad (0..1, zero padding), its graph normalises inside.
    images = torch.stack([resize_and_pad(frame, SIZE)[0] for frame in frames]).numpy()
    padding = tao == (-np.float32(TAO_SCALE) * TAO_CONFIG_OFFSETS[:, None, None])
    assert padding[0, :, :, 51:].all() and padding[1, :, 32:].all()  # 64x51 and 32x64 frames
    assert np.all(images[padding] == 0)  # nvinfer's black is maskops' zero padding
    maskops = _run(maskops_graph, OUTPUT_NAMES, images)
    detections, mask_logits = _run(tao_graph, TAO_OUTPUT_NAMES, tao)
    for image in range(len(frames)):
        assert int(maskops[4][image, 0]) > 0
        for threshold in (0.0, 0.26):
            parsed = parse_mrcnn_tlt_v2(
                detections[image],
                mask_logits[image],
                width=SIZE[1],
                height=SIZE[0],
                num_classes_configured=CLASSES,
                threshold=threshold,
            )
            want = expected_objects(
                maskops, image, width=SIZE[1], height=SIZE[0], threshold=threshold
            )
            assert want
            assert_close_objects(parsed, want)


def test_the_input_nodes_give_back_pixel_over_255(maskops_graph, tao_graph):
    """The prepended nodes alone, run by onnxruntime on every pixel value as nvinfer
    preprocesses it with TAO's keys."""
    prefix = onnx.helper.make_graph(
        _prepended(tao_graph, maskops_graph),
        "input",
        [onnx.helper.make_tensor_value_info("Input", onnx.TensorProto.FLOAT, None)],
        [onnx.helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT, None)],
    )
    model = onnx.helper.make_model(prefix, opset_imports=tao_graph.opset_import)
    model.ir_version = tao_graph.ir_version
    pixels = np.tile(np.arange(256, dtype=np.float32), (1, 3, 1, 1))  # [1, 3, 1, 256]
    tao = np.float32(TAO_SCALE) * (pixels - TAO_CONFIG_OFFSETS[:, None, None])
    (back,) = _run(model, ("images",), tao)
    assert np.abs(back - pixels / np.float32(255)).max() <= 6e-8
    assert np.all(back[..., 0] == 0)  # nvinfer's black padding is maskops' zero padding


def test_taos_offsets_are_imagenets_mean_in_pixels():
    # Not needed for the round trip (the offsets cancel), but it makes the graph's own
    # normalisation (x - offsets) / (255 std): the offsets nvinfer subtracts are the means.
    assert np.allclose(TAO_OFFSETS, np.array(IMAGENET_MEAN) * 255, rtol=0, atol=1e-9)
    assert np.array_equal(np.array(TAO_OFFSETS, np.float32), TAO_CONFIG_OFFSETS)


def test_the_layout_check_names_the_output(maskops_graph, tao_graph):
    sizes = {"max_detections": DETECTIONS, "mask_resolution": RESOLUTION}
    assert tao_layout_problems(tao_graph, num_classes=CLASSES, **sizes) == []
    wrong_classes = tao_layout_problems(tao_graph, num_classes=CLASSES + 1, **sizes)
    assert wrong_classes == [
        "mask_fcn_logits/BiasAdd: dimension 2 is 4 (declared), expected the static 5 "
        "(shape ['N', 12, 5, 28, 28])"
    ]
    maskops = tao_layout_problems(maskops_graph, num_classes=CLASSES, **sizes)
    assert maskops[0] == (
        "inputs ['images']: expected 'Input' alone (TAO's engine input, fed with TAO's "
        "preprocessing)"
    )
    assert "generate_detections: missing (the parser looks the output up by this name)" in maskops
    assert any(p.startswith("boxes: an output") for p in maskops)
    # A graph that declares the right shape but computes another is caught too.
    lying = to_tao_layout(maskops_graph, num_classes=CLASSES - 1, **sizes)
    declared = lying.graph.output[1].type.tensor_type.shape.dim
    for dim, size in zip(declared[1:], (12, 4, 28, 28), strict=True):
        dim.dim_value = size
    (problem,) = tao_layout_problems(lying, num_classes=CLASSES, **sizes)
    assert problem.startswith("mask_fcn_logits/BiasAdd: dimension 2 is 3 (computed by the graph)")
    # The parser looks layers up as FLOAT: an int64 class column would not be found.
    mistyped = onnx.ModelProto()
    mistyped.CopyFrom(tao_graph)
    mistyped.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.INT64
    assert tao_layout_problems(mistyped, num_classes=CLASSES, **sizes) == [
        "generate_detections: element type INT64 (declared), the parser reads FLOAT only"
    ]
    # nvinfer feeds a FLOAT [N, 3, H, W] of the infer-dims.
    unsized = onnx.ModelProto()
    unsized.CopyFrom(tao_graph)
    unsized.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "width"
    assert tao_layout_problems(unsized, num_classes=CLASSES, **sizes) == [
        "Input: shape ['batch', 3, 64, 'width'], expected [N, 3, H, W] with static H, W"
    ]


def test_the_layout_follows_the_destination():
    assert choose_output_layout(None, engine=False, gen_ds_config=False) == "maskops"
    assert choose_output_layout(None, engine=True, gen_ds_config=False) == "tao"
    assert choose_output_layout(None, engine=False, gen_ds_config=True) == "tao"
    assert choose_output_layout("maskops", engine=True, gen_ds_config=False) == "maskops"
    assert choose_output_layout("tao", engine=False, gen_ds_config=False) == "tao"
    with pytest.raises(ValueError, match="no DeepStream parser reads maskops'"):
        choose_output_layout("maskops", engine=False, gen_ds_config=True)
    with pytest.raises(ValueError, match="--output_layout 'uff'"):
        choose_output_layout("uff", engine=False, gen_ds_config=False)


@pytest.fixture(scope="module")
def tao_export(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path, tiny_spec: ExperimentSpec
):
    """The tiny checkpoint exported for DeepStream (the default layout is then TAO's)."""
    out = tmp_path_factory.mktemp("tao_export") / "model.onnx"
    return export_onnx(
        tiny_checkpoint,
        tiny_spec,
        out,
        gen_ds_config=True,
        engine_file=out.with_suffix(".engine"),
        log=lambda _: None,
    )


def test_a_deepstream_export_has_the_tao_layout(tao_export, tiny_checkpoint):
    result = tao_export
    assert result.parity.passed and result.parity.reference_detections > 0
    assert [o["name"] for o in result.io["outputs"]] == list(TAO_OUTPUT_NAMES)
    d, m = result.metadata.max_detections, result.metadata.mask_resolution
    assert (d, m) == (20, 16)  # tiny_spec's
    assert [o["shape"] for o in result.io["outputs"]] == [["batch", d, 6], ["batch", d, 4, m, m]]
    assert result.io["inputs"] == [
        {"name": "Input", "dtype": "float", "shape": ["batch", 3, 128, 128]}
    ]
    metadata = read_metadata(result.onnx_path)
    assert (metadata.output_layout, metadata.input_convention) == ("tao", "tao")
    report = json.loads(result.report_path.read_text())
    assert (report["output_layout"], report["input_convention"]) == ("tao", "tao")
    # What DeepStream would read from the file, fed with TAO's preprocessing, is what
    # PyTorch detects on the same pixels.
    loaded = load_model(tiny_checkpoint)
    generators = [torch.Generator().manual_seed(i) for i in (3, 4)]
    pixels = [torch.randint(0, 256, (3, 128, 128), generator=g).float() for g in generators]
    tao = np.float32(TAO_SCALE) * (torch.stack(pixels).numpy() - TAO_CONFIG_OFFSETS[:, None, None])
    session = ort.InferenceSession(str(result.onnx_path), providers=["CPUExecutionProvider"])
    detections, masks = session.run(list(TAO_OUTPUT_NAMES), {"Input": tao})
    with torch.inference_mode():
        reference = loaded.model([p / 255 for p in pixels])
    for image, want in enumerate(reference):
        parsed = parse_mrcnn_tlt_v2(
            detections[image],
            masks[image],
            width=128,
            height=128,
            num_classes_configured=4,
            threshold=0.0,
        )
        assert [o.class_id for o in parsed] == want["labels"].tolist()
        scores = [o.score for o in parsed]
        np.testing.assert_allclose(scores, want["scores"].numpy(), atol=2e-3)


def _config(path: Path) -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        elif line and not line.startswith("#"):
            key, value = line.split("=", 1)
            current[key] = value
    return sections


def test_gen_trt_engine_takes_a_tao_layout_file(tao_export, tmp_path, capsys):
    from maskops.cli.main import main as cli_main
    from maskops.export.tensorrt import onnx_engine_inputs, tensorrt_unavailable_reason

    inputs = onnx_engine_inputs(tao_export.onnx_path)
    assert (inputs.image_size, inputs.batch, inputs.is_qdq) == ((128, 128), None, False)
    argv = ["gen_trt_engine", "-m", str(tao_export.onnx_path), "-r", str(tmp_path)]
    code = cli_main([*argv, "--min_batch_size", "2"])
    if tensorrt_unavailable_reason():  # every check passed; only TensorRT is missing here
        assert code == 1 and "no TensorRT engine built" in capsys.readouterr().err


def test_files_without_the_convention_take_maskops_input():
    props = GraphMetadata(
        spec=ExperimentSpec(),
        label_map=LabelMap.from_coco_categories([{"id": 1, "name": "thing"}]),
        data_type="fp32",
        image_size=(64, 64),
        max_detections=5,
        mask_resolution=14,
        output_layout="tao",
    ).to_props()
    assert props["maskops_input_convention"] == "maskops"
    del props["maskops_input_convention"]  # a TAO-layout file exported before the TAO input
    assert GraphMetadata.from_props(props, source="old").input_convention == "maskops"


def test_evaluate_runs_a_tao_layout_file(tao_export, tiny_spec, tiny_checkpoint):
    from maskops.evaluation import run_evaluation

    onnx_metrics = run_evaluation(
        tiny_spec, tao_export.onnx_path, progress=False, log=lambda _: None
    )
    torch_metrics = run_evaluation(tiny_spec, tiny_checkpoint, progress=False, log=lambda _: None)
    assert set(onnx_metrics) == set(torch_metrics)
    for key in ("AP", "mask_AP", "ARmax100"):
        assert onnx_metrics[key] == pytest.approx(torch_metrics[key], abs=0.01)


def test_the_deepstream_config_is_taos_with_aspect_kept(tao_export):
    labels, config = tao_export.deepstream_files
    assert labels.read_text().splitlines() == ["BG", "circle", "square", "triangle"]
    sections = _config(config)
    prop = sections["property"]
    # The keys of TAO's Mask R-CNN config (deepstream_tao_apps' PeopleSegNet), same values.
    assert {k: prop[k] for k in ("network-type", "output-instance-mask", "cluster-mode")} == {
        "network-type": "3",
        "output-instance-mask": "1",
        "cluster-mode": "4",
    }
    assert prop["output-blob-names"] == "generate_detections;mask_fcn_logits/BiasAdd"
    assert prop["parse-bbox-instance-mask-func-name"] == PARSE_FUNCTION
    assert PARSE_FUNCTION == "NvDsInferParseCustomMrcnnTLTV2"
    assert prop["custom-lib-path"] == PARSER_LIBRARY
    assert PARSER_LIBRARY == "/opt/nvidia/deepstream/deepstream/lib/libnvds_infercustomparser.so"
    assert prop["num-detected-classes"] == "4" and prop["labelfile-path"] == "labels.txt"
    assert prop["infer-dims"] == "3;128;128"
    assert (prop["onnx-file"], prop["model-engine-file"]) == ("model.onnx", "model.engine")
    assert (prop["network-mode"], prop["batch-size"]) == ("0", "16")
    # TAO's preprocessing (the values of TAO's configs), RGB...
    assert float(prop["net-scale-factor"]) == TAO_SCALE and prop["model-color-format"] == "0"
    offsets = [float(v) for v in prop["offsets"].split(";")]
    assert np.array_equal(np.array(offsets, np.float32), TAO_CONFIG_OFFSETS)
    # ...on frames scaled as maskops trains: aspect ratio kept, padded bottom/right.
    assert (prop["maintain-aspect-ratio"], prop["symmetric-padding"]) == ("1", "0")
    assert float(prop["segmentation-threshold"]) == 0.0  # logits: probability 0.5
    assert not {"tlt-encoded-model", "tlt-model-key", "uff-input-blob-name"} & set(prop)
    assert sections["class-attrs-all"] == {"pre-cluster-threshold": "0.5", "topk": "20"}


def test_deepstream_files_need_the_tao_layout(tmp_path, tiny_checkpoint, tiny_spec):
    with pytest.raises(ExportError, match="--gen_ds_config writes a DeepStream config for the"):
        export_onnx(
            tiny_checkpoint,
            tiny_spec,
            tmp_path / "m.onnx",
            gen_ds_config=True,
            output_layout="maskops",
            log=lambda _: None,
        )
    assert not list(tmp_path.iterdir())


def test_cli_output_layout(tmp_path, tiny_spec, capsys):
    from maskops.cli.main import build_parser
    from maskops.cli.main import main as cli_main
    from maskops.spec import spec_to_text

    spec_file = tmp_path / "spec.txt"
    spec_file.write_text(spec_to_text(tiny_spec))
    export = ["export", "-m", str(tmp_path / "m.pth"), "-e", str(spec_file)]
    assert build_parser().parse_args(export).output_layout is None
    assert build_parser().parse_args([*export, "--output_layout", "tao"]).output_layout == "tao"
    code = cli_main([*export, "--gen_ds_config", "--output_layout", "maskops"])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--gen_ds_config writes a DeepStream config for the TAO output layout only" in line


@pytest.mark.gpu
@needs_tensorrt
def test_tensorrt_gives_the_tao_outputs_static_shapes(tmp_path, tao_export):
    import tensorrt as trt

    engine_path = build_engine(
        tao_export.onnx_path,
        tmp_path / "m.engine",
        data_type="fp32",
        image_size=(128, 128),
        profile=BatchProfile(1, 2, 4),
    )
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
    shapes = {name: tuple(engine.get_tensor_shape(name)) for name in ("Input", *TAO_OUTPUT_NAMES)}
    assert shapes == {
        "Input": (-1, 3, 128, 128),
        "generate_detections": (-1, 20, 6),
        "mask_fcn_logits/BiasAdd": (-1, 20, 4, 16, 16),
    }
