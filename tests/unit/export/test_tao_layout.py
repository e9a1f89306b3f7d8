"""TAO's output layout: what DeepStream's NvDsInferParseCustomMrcnnTLTV2 reads from it is
what the maskops layout says, the layout check, and the DeepStream config."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from maskops.checkpoint import load_model
from maskops.export import OUTPUT_NAMES, ExportError, export_onnx, read_metadata
from maskops.export.batching import batch_over_images
from maskops.export.deepstream import PARSE_FUNCTION, PARSER_LIBRARY
from maskops.export.graph import trace_to_onnx
from maskops.export.tao_layout import (
    FILL_LOGIT,
    TAO_OUTPUT_NAMES,
    choose_output_layout,
    tao_layout_problems,
    to_tao_layout,
)
from maskops.export.tensorrt import BatchProfile, build_engine
from maskops.modeling import build_model
from maskops.spec.models import ExperimentSpec, MaskRCNNConfig

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
    return batch_over_images(trace_to_onnx(model, image_size=SIZE, max_detections=DETECTIONS))


@pytest.fixture(scope="module")
def tao_graph(maskops_graph: onnx.ModelProto) -> onnx.ModelProto:
    sizes = {"max_detections": DETECTIONS, "mask_resolution": RESOLUTION}
    return to_tao_layout(maskops_graph, num_classes=CLASSES, **sizes)


def _run(model: onnx.ModelProto, names: tuple[str, ...], images: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    result: list[np.ndarray] = session.run(list(names), {"images": images})
    return result


def test_the_parser_reads_the_maskops_detections(maskops_graph, tao_graph):
    onnx.checker.check_model(tao_graph, full_check=True)
    assert [o.name for o in tao_graph.graph.output] == list(TAO_OUTPUT_NAMES)
    assert len(tao_graph.graph.node) > len(maskops_graph.graph.node)  # appended, not rebuilt
    assert tao_graph.graph.node[: len(maskops_graph.graph.node)] == maskops_graph.graph.node
    images = np.random.default_rng(1).random((2, 3, *SIZE), dtype=np.float32)
    maskops = _run(maskops_graph, OUTPUT_NAMES, images)
    detections, mask_logits = _run(tao_graph, TAO_OUTPUT_NAMES, images)
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


def test_the_layout_check_names_the_output(maskops_graph, tao_graph):
    sizes = {"max_detections": DETECTIONS, "mask_resolution": RESOLUTION}
    assert tao_layout_problems(tao_graph, num_classes=CLASSES, **sizes) == []
    wrong_classes = tao_layout_problems(tao_graph, num_classes=CLASSES + 1, **sizes)
    assert wrong_classes == [
        "mask_fcn_logits/BiasAdd: dimension 2 is 4 (declared), expected the static 5 "
        "(shape ['N', 12, 5, 28, 28])"
    ]
    maskops = tao_layout_problems(maskops_graph, num_classes=CLASSES, **sizes)
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
    assert read_metadata(result.onnx_path).output_layout == "tao"
    assert json.loads(result.report_path.read_text())["output_layout"] == "tao"
    # What DeepStream would read from the file is what PyTorch detects.
    loaded = load_model(tiny_checkpoint)
    images = [torch.rand(3, 128, 128, generator=torch.Generator().manual_seed(i)) for i in (3, 4)]
    session = ort.InferenceSession(str(result.onnx_path), providers=["CPUExecutionProvider"])
    detections, masks = session.run(list(TAO_OUTPUT_NAMES), {"images": torch.stack(images).numpy()})
    with torch.inference_mode():
        reference = loaded.model(images)
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


def test_the_deepstream_config_is_taos_with_maskops_preprocessing(tao_export):
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
    assert prop["infer-dims"] == "3;128;128" and prop["model-color-format"] == "0"
    assert (prop["onnx-file"], prop["model-engine-file"]) == ("model.onnx", "model.engine")
    assert (prop["network-mode"], prop["batch-size"]) == ("0", "16")
    # maskops' preprocessing: 0..1 RGB, aspect ratio kept, zero padding bottom/right.
    assert float(prop["net-scale-factor"]) == pytest.approx(1 / 255, rel=1e-12)
    assert "offsets" not in prop
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
def test_tensorrt_gives_the_tao_outputs_static_shapes(tmp_path, tao_export):
    trt = pytest.importorskip("tensorrt")
    engine_path = build_engine(
        tao_export.onnx_path,
        tmp_path / "m.engine",
        data_type="fp32",
        image_size=(128, 128),
        profile=BatchProfile(1, 2, 4),
    )
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
    shapes = {name: tuple(engine.get_tensor_shape(name)) for name in TAO_OUTPUT_NAMES}
    assert shapes == {
        "generate_detections": (-1, 20, 6),
        "mask_fcn_logits/BiasAdd": (-1, 20, 4, 16, 16),
    }
