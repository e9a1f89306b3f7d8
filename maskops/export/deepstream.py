"""DeepStream files for an export (``--gen_ds_config``): labels.txt and an nvinfer config.

They are for the TAO output layout (:mod:`maskops.export.tao_layout`), parsed by
DeepStream's own ``NvDsInferParseCustomMrcnnTLTV2``, so a TAO Mask R-CNN DeepStream app runs
a maskops engine with this config in place of TAO's. The reference is TAO's PeopleSegNet
(Mask R-CNN) config: NVIDIA-AI-IOT/deepstream_tao_apps
``configs/nvinfer/peopleSegNet_tao/pgie_peopleSegNet_tao_config.txt`` (up to its
DeepStream 7.0 branch; the 7.1 update removed PeopleSegNet) and DeepStream's
``sources/apps/sample_apps/deepstream-mrcnn-app/dsmrcnn_pgie_config.txt``. Kept from it:
``network-type=3``, ``output-instance-mask=1``, ``cluster-mode=4`` (nvinfer's
instance-mask post-processing accepts no other), ``output-blob-names``,
``parse-bbox-instance-mask-func-name``, ``custom-lib-path`` (the library DeepStream ships
in its container), ``num-detected-classes`` (C, background included), ``infer-dims``, and
TAO's preprocessing: ``net-scale-factor=0.017507``, ``offsets=123.675;116.28;103.53``,
``model-color-format=0`` (RGB), which the TAO layout's input takes
(:mod:`maskops.export.tao_layout` maps it back to maskops' 0..1 exactly). What differs, and
why:

- ``maintain-aspect-ratio=1``, ``symmetric-padding=0``, ``scaling-filter=1``: TAO's config
  leaves nvinfer's default, which stretches frames to the input size; maskops was trained on
  images resized keeping the aspect ratio and zero-padded bottom/right
  (:func:`maskops.data.transforms.resize_and_pad`; tao_deploy's Mask R-CNN evaluation also
  keeps the aspect ratio and pads bottom/right, ``cv/mask_rcnn/dataloader.py``), so nvinfer
  scales the same way, bilinear, and pads bottom/right with black, which reaches the graph
  as maskops' zero padding. nvinfer maps the boxes back to the frame through that scaling.
  A config that stretches still runs the model, but on frames whose aspect ratio differs
  from ``infer-dims``' every object is distorted by that ratio, a geometry training never
  showed it (docs/deepstream.md).
- ``segmentation-threshold=0.0`` written out (it is nvinfer's default, which TAO's config
  relies on): the masks are logits, so 0 is probability 0.5.
- no ``tlt-encoded-model`` / ``tlt-model-key`` / ``uff-input-blob-name`` (no ``.etlt``):
  ``onnx-file`` and ``model-engine-file`` name the export's files; no ``int8-calib-file``
  (an int8 export carries its scales as Q/DQ nodes).
"""

from __future__ import annotations

from pathlib import Path

from maskops.data.labels import LabelMap
from maskops.export.tao_layout import (
    TAO_COLOR_FORMAT,
    TAO_NET_SCALE_FACTOR,
    TAO_OFFSETS,
    TAO_OUTPUT_NAMES,
)

NETWORK_MODE = {"fp32": 0, "int8": 1, "fp16": 2}
"""nvinfer's ``network-mode`` values."""
PARSE_FUNCTION = "NvDsInferParseCustomMrcnnTLTV2"
PARSER_LIBRARY = "/opt/nvidia/deepstream/deepstream/lib/libnvds_infercustomparser.so"
"""DeepStream's stock custom parser library (``sources/libs/nvdsinfer_customparser``),
installed there in DeepStream's containers; it has the parser."""


def labels_text(label_map: LabelMap, num_classes: int | None = None) -> str:
    """One name per line, line i for class id i: ``BG`` for 0, the categories in label
    order, then ``class_<i>`` for classes the model has beyond the label map (a spec's
    ``num_classes`` may exceed the categories)."""
    names = ["BG", *label_map.names]
    names += [f"class_{i}" for i in range(len(names), num_classes or 0)]
    return "\n".join(names) + "\n"


def nvinfer_config(
    *,
    onnx_file: str,
    engine_file: str,
    labels_file: str,
    data_type: str,
    image_size: tuple[int, int],
    num_classes: int,
    mask_resolution: int,
    max_batch_size: int,
    max_detections: int,
) -> str:
    """An nvinfer config (``[property]`` and ``[class-attrs-all]``) for a TAO-layout export.

    Args:
        num_classes: C, the model's classes with background (the mask channels).
        max_detections: D, the rows per image (``topk``).
    """
    height, width = image_size
    return f"""\
# DeepStream nvinfer config written by `maskops export --gen_ds_config` for the TAO output
# layout: generate_detections [N, {max_detections}, 6], \
mask_fcn_logits/BiasAdd [N, {max_detections}, {num_classes}, {mask_resolution}, \
{mask_resolution}] (mask logits).
# Input: TAO's preprocessing (RGB, 0.017507 * (pixel - offsets)), {height}x{width}, aspect
# ratio kept, padded bottom/right (as the model was trained).
[property]
gpu-id=0
net-scale-factor={TAO_NET_SCALE_FACTOR!r}
offsets={";".join(repr(offset) for offset in TAO_OFFSETS)}
model-color-format={TAO_COLOR_FORMAT}
maintain-aspect-ratio=1
symmetric-padding=0
scaling-filter=1
onnx-file={onnx_file}
model-engine-file={engine_file}
labelfile-path={labels_file}
infer-dims=3;{height};{width}
batch-size={max_batch_size}
## 0=FP32, 1=INT8, 2=FP16
network-mode={NETWORK_MODE[data_type]}
num-detected-classes={num_classes}
interval=0
gie-unique-id=1
## 3: instance segmentation
network-type=3
output-instance-mask=1
## 4: no clustering (the model ran NMS); the only mode nvinfer takes for instance masks
cluster-mode=4
output-blob-names={";".join(TAO_OUTPUT_NAMES)}
parse-bbox-instance-mask-func-name={PARSE_FUNCTION}
custom-lib-path={PARSER_LIBRARY}
## masks are logits: 0.0 keeps the pixels of probability >= 0.5
segmentation-threshold=0.0

[class-attrs-all]
pre-cluster-threshold=0.5
topk={max_detections}
"""


def write_deepstream_files(
    out_dir: Path,
    *,
    onnx_path: Path,
    engine_path: Path,
    label_map: LabelMap,
    num_classes: int,
    data_type: str,
    image_size: tuple[int, int],
    mask_resolution: int,
    max_batch_size: int,
    max_detections: int,
) -> list[Path]:
    """Write ``labels.txt`` and ``nvinfer_config.txt`` into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = out_dir / "labels.txt"
    labels.write_text(labels_text(label_map, num_classes))
    config = out_dir / "nvinfer_config.txt"
    config.write_text(
        nvinfer_config(
            onnx_file=onnx_path.name,
            engine_file=engine_path.name,
            labels_file=labels.name,
            data_type=data_type,
            image_size=image_size,
            num_classes=num_classes,
            mask_resolution=mask_resolution,
            max_batch_size=max_batch_size,
            max_detections=max_detections,
        )
    )
    return [labels, config]
