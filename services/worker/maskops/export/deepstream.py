"""DeepStream files for an export (``--gen_ds_config``): labels.txt and an nvinfer config."""

from __future__ import annotations

from pathlib import Path

from maskops.data.labels import LabelMap

NETWORK_MODE = {"fp32": 0, "int8": 1, "fp16": 2}
"""nvinfer's ``network-mode`` values."""


def labels_text(label_map: LabelMap) -> str:
    """One name per line: ``BG`` for label 0, then the categories in label order."""
    return "\n".join(["BG", *label_map.names]) + "\n"


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
) -> str:
    """An nvinfer ``[property]`` section for instance segmentation with this model.

    The graph normalises inside (ImageNet mean/std on 0..1 RGB), so nvinfer only scales
    pixels to 0..1 (``net-scale-factor`` 1/255) and keeps the aspect ratio with bottom/right
    padding, as maskops' own preprocessing does. The output is parsed by a custom
    ``NvDsInferInstanceMaskParser`` for the ``boxes/scores/labels/masks/num_detections``
    layout (DeepStream's TAO Mask R-CNN parser expects TAO's layout and does not apply).
    """
    height, width = image_size
    return f"""\
# DeepStream nvinfer config written by `maskops export --gen_ds_config`.
# Inputs: RGB 0..1 (the graph normalises), {height}x{width}, aspect kept, padded bottom/right.
[property]
gpu-id=0
net-scale-factor=0.00392156862745098
model-color-format=0
onnx-file={onnx_file}
model-engine-file={engine_file}
labelfile-path={labels_file}
infer-dims=3;{height};{width}
batch-size={max_batch_size}
network-mode={NETWORK_MODE[data_type]}
num-detected-classes={num_classes}
interval=0
gie-unique-id=1
network-type=3
output-blob-names=boxes;scores;labels;masks;num_detections
segmentation-threshold=0.5
maintain-aspect-ratio=1
symmetric-padding=0
output-instance-mask=1
cluster-mode=4
# A parser for maskops' output layout (mask resolution {mask_resolution}) goes here:
# parse-bbox-instance-mask-func-name=NvDsInferParseMaskopsMaskRCNN
# custom-lib-path=/opt/maskops/libnvds_maskops_parser.so

[class-attrs-all]
pre-cluster-threshold=0.5
topk=100
"""


def write_deepstream_files(
    out_dir: Path,
    *,
    onnx_path: Path,
    engine_path: Path,
    label_map: LabelMap,
    data_type: str,
    image_size: tuple[int, int],
    mask_resolution: int,
    max_batch_size: int,
) -> list[Path]:
    """Write ``labels.txt`` and ``nvinfer_config.txt`` into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = out_dir / "labels.txt"
    labels.write_text(labels_text(label_map))
    config = out_dir / "nvinfer_config.txt"
    config.write_text(
        nvinfer_config(
            onnx_file=onnx_path.name,
            engine_file=engine_path.name,
            labels_file=labels.name,
            data_type=data_type,
            image_size=image_size,
            num_classes=label_map.num_classes,
            mask_resolution=mask_resolution,
            max_batch_size=max_batch_size,
        )
    )
    return [labels, config]
