"""The ``config.pbtxt`` of every model of a published ensemble (:func:`render_configs`).

Four configs: the python preprocess and postprocess models, the network on its backend
(``python`` or ``torch`` inside the python backend, Triton's ``onnxruntime`` or
``tensorrt``; see :mod:`maskops.serving.repository` for what each serves), and the
ensemble clients call, which chains them. Every model serves the latest version only and
batches dynamically up to ``max_batch_size``; tensor names and the network's reported
parameters are :mod:`maskops.serving.protocol`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from maskops.serving.placement import Placement, tensorrt_accelerator
from maskops.serving.protocol import (
    DETECTIONS_JSON,
    IMAGE_BYTES,
    NET_INPUT,
    NET_OUTPUTS,
    NET_PARAMETERS,
    ORIG_HW,
    SCALE,
    SCORE_THRESHOLD,
    EnsembleNames,
)
from maskops.serving.publish_options import NET_BACKENDS as NET_BACKENDS
from maskops.serving.publish_options import NETWORK_QUEUE_DELAY_US
from maskops.serving.publish_options import NetBackend as NetBackend

if TYPE_CHECKING:
    from maskops.export.graph import GraphMetadata


class PublishError(ValueError):
    """The export cannot be published (missing file, bad name, not a maskops export)."""


@dataclass(frozen=True)
class InstanceCounts:
    """How many instances of each model Triton runs (its ``instance_group`` counts)."""

    network: int = 1
    """The network's (per GPU on GPUs)."""
    processing: int = 1
    """The preprocess and postprocess models' each, processes on the CPU."""


def _dims(values: tuple[int, ...] | list[int]) -> str:
    return "[ " + ", ".join(str(v) for v in values) + " ]"


def _tensor(
    name: str, dtype: str, dims: tuple[int, ...] | list[int], *, ragged: bool = False
) -> str:
    extra = " allow_ragged_batch: true" if ragged else ""
    return f'  {{ name: "{name}" data_type: {dtype} dims: {_dims(dims)}{extra} }}'


def _encoded(name: str, *, ragged: bool = False) -> str:
    """An encoded file (image, JSON answer) as UINT8 of any length per item (the
    dynamic batcher batches items of unequal lengths where ``ragged``)."""
    return _tensor(name, "TYPE_UINT8", (-1,), ragged=ragged)


def _config(
    name: str,
    *,
    backend: str,
    max_batch_size: int,
    inputs: list[str],
    outputs: list[str],
    extra: str = "",
) -> str:
    sep = ",\n"
    return (
        f'name: "{name}"\n{backend}\nmax_batch_size: {max_batch_size}\n'
        f"version_policy: {{ latest: {{ num_versions: 1 }} }}\n"
        f"input [\n{sep.join(inputs)}\n]\noutput [\n{sep.join(outputs)}\n]\n{extra}"
    )


def image_type(net_backend: str) -> str:
    """The data type of the network's input image (:data:`NET_INPUT`) on ``net_backend``:
    UINT8 on the torch network, which divides by 255 on its device (a quarter of the 13 MB
    an 832x1344 float image takes to hand from the preprocess model to the network and to
    copy to a GPU); FP32 on the others, whose exported graph takes floats."""
    return "TYPE_UINT8" if net_backend == "torch" else "TYPE_FP32"


def _net_tensors(meta: GraphMetadata, net_backend: str) -> tuple[list[str], list[str]]:
    d, m = meta.max_detections, meta.mask_resolution
    inputs = [_tensor(NET_INPUT, image_type(net_backend), (3, *meta.image_size))]
    types = ("TYPE_FP32", "TYPE_FP32", "TYPE_INT64", "TYPE_FP32", "TYPE_INT32")
    shapes: tuple[tuple[int, ...], ...] = ((d, 4), (d,), (d,), (d, m, m), (1,))
    outputs = [
        _tensor(name, dtype, dims)
        for name, dtype, dims in zip(NET_OUTPUTS, types, shapes, strict=True)
    ]
    return inputs, outputs


def _net_parameters(backend: str, device: str, precision: str) -> str:
    """The network config's record of where and how it runs (:data:`NET_PARAMETERS`)."""
    reported = {"net_backend": backend, "device": device, "precision": precision}
    return "".join(
        f'parameters {{ key: "{key}" value: {{ string_value: "{reported[ours]}" }} }}\n'
        for key, ours in NET_PARAMETERS.items()
    )


def _batching(max_queue_delay_us: int) -> str:
    return f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}\n"


def _instances(count: int, kind: str = "KIND_CPU") -> str:
    return f"instance_group [ {{ kind: {kind} count: {count} }} ]\n"


def network_batch_size(meta: GraphMetadata, net_backend: str, batch: int) -> int:
    """The network model's max_batch_size: ``batch``; 1 for a graph of static batch 1 on
    the tensorrt backend (Triton checks a plan's dimensions after the batch one). The python
    backend fills a static batch itself.

    Raises:
        PublishError: a static batch the backend cannot serve: Triton's onnxruntime backend
            batches only a graph whose first dimension is dynamic (it refuses to load one
            of a fixed batch, even of 1, under a max_batch_size), the tensorrt backend
            runs one of 1 only.
    """
    if net_backend in ("python", "torch") or meta.batch_size is None:
        return batch
    if meta.batch_size == 1 and net_backend == "tensorrt":
        return 1
    takes = "batches a dynamic batch only" if net_backend == "onnxruntime" else "runs batch 1 only"
    others = "python" if meta.batch_size > 1 else "python, or tensorrt with an engine"
    raise PublishError(
        f"the export has a static batch of {meta.batch_size}: Triton's {net_backend} backend "
        f"{takes}; export without --static_batch_size, or publish with --net_backend {others}"
    )


def render_configs(
    names: EnsembleNames,
    meta: GraphMetadata,
    *,
    net_backend: NetBackend = "python",
    max_batch_size: int | None = None,
    instances: InstanceCounts | None = None,
    max_queue_delay_us: int = NETWORK_QUEUE_DELAY_US,
    placement: Placement | None = None,
    engine_cache: str | None = None,
    precision: str | None = None,
) -> dict[str, str]:
    """``{triton model name: config.pbtxt text}`` for the four models.

    ``placement`` says where the network runs (default: the CPU), ``instances`` how many
    instances of each model Triton runs (default: one each); ``engine_cache`` is
    the folder, as Triton sees it, where onnxruntime's TensorRT accelerator caches its
    engines (GPU placements of the onnxruntime backend; None: no cache); ``precision``
    the torch backend's (default: the export's data type); ``max_queue_delay_us`` how
    long the network's dynamic batcher waits to fill a batch (the processing models do
    not wait: :func:`_processing_configs`).
    """
    placement, instances = placement or Placement(), instances or InstanceCounts()
    batch = max_batch_size or meta.max_batch_size
    net_batch = network_batch_size(meta, net_backend, batch)
    configs = _processing_configs(names, meta, batch, instances.processing, net_backend)
    configs[names.net] = _net_config(
        names.net,
        meta,
        net_backend=net_backend,
        net_batch=net_batch,
        extra=placement.instance_group(instances.network)
        + _net_parameters(net_backend, placement.device, precision or meta.data_type),
        max_queue_delay_us=max_queue_delay_us,
        accelerator=(
            tensorrt_accelerator(meta.data_type, engine_cache=engine_cache)
            if net_backend == "onnxruntime" and placement.device == "gpu"
            else ""
        ),
    )
    configs[names.name] = _ensemble_config(names, min(batch, net_batch))
    return configs


def _image_tensors(meta: GraphMetadata, net_backend: str) -> list[str]:
    """The preprocess model's outputs: the network's input, the scale, the original size."""
    return [
        _tensor(NET_INPUT, image_type(net_backend), (3, *meta.image_size)),
        _tensor(SCALE, "TYPE_FP32", (1,)),
        _tensor(ORIG_HW, "TYPE_INT32", (2,)),
    ]


def _processing_configs(
    names: EnsembleNames, meta: GraphMetadata, batch: int, instances: int, net_backend: str
) -> dict[str, str]:
    """The configs of the python preprocess and postprocess models.

    They batch with no queue delay: each works through its batch one image at a time, so
    a fuller batch saves nothing, and waiting for one added the whole delay to every
    request of a lone client (2 ms each, Triton's statistics on a CPU). Requests that
    arrive while an instance is busy still queue and go in its next batch.
    """
    _, net_outputs = _net_tensors(meta, net_backend)
    image_outputs = _image_tensors(meta, net_backend)
    extra = _batching(0) + _instances(instances)
    return {
        names.preprocess: _config(
            names.preprocess,
            backend='backend: "python"',
            max_batch_size=batch,
            inputs=[_encoded(IMAGE_BYTES, ragged=True)],
            outputs=image_outputs,
            extra=extra,
        ),
        names.postprocess: _config(
            names.postprocess,
            backend='backend: "python"',
            max_batch_size=batch,
            inputs=[
                *net_outputs,
                *image_outputs[1:],
                _tensor(SCORE_THRESHOLD, "TYPE_FP32", (1,)),
            ],
            outputs=[_encoded(DETECTIONS_JSON)],
            extra=extra,
        ),
    }


def _ensemble_step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'    {{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


def _ensemble_config(names: EnsembleNames, batch: int) -> str:
    """The ensemble clients call: preprocess -> network -> postprocess."""
    # Intermediate tensors get a leading "_" (ensemble-internal names).
    image_keys = {k: f"_{k}" for k in (NET_INPUT, SCALE, ORIG_HW)}
    detection_keys = {k: f"_{k}" for k in NET_OUTPUTS}
    steps = [
        _ensemble_step(names.preprocess, {IMAGE_BYTES: IMAGE_BYTES}, image_keys),
        _ensemble_step(names.net, {NET_INPUT: image_keys[NET_INPUT]}, detection_keys),
        _ensemble_step(
            names.postprocess,
            {
                **detection_keys,
                SCALE: image_keys[SCALE],
                ORIG_HW: image_keys[ORIG_HW],
                SCORE_THRESHOLD: SCORE_THRESHOLD,
            },
            {DETECTIONS_JSON: DETECTIONS_JSON},
        ),
    ]
    return _config(
        names.name,
        backend='platform: "ensemble"',
        max_batch_size=batch,
        inputs=[
            _encoded(IMAGE_BYTES),
            _tensor(SCORE_THRESHOLD, "TYPE_FP32", (1,)),
        ],
        outputs=[_encoded(DETECTIONS_JSON)],
        extra="ensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}\n",
    )


def _net_config(
    name: str,
    meta: GraphMetadata,
    *,
    net_backend: str,
    net_batch: int,
    extra: str,
    max_queue_delay_us: int,
    accelerator: str,
) -> str:
    """The network model's config.pbtxt (``extra``: its instance_group)."""
    net_inputs, net_outputs = _net_tensors(meta, net_backend)
    if net_backend in ("python", "torch"):
        return _config(
            name,
            backend='backend: "python"',
            max_batch_size=net_batch,
            inputs=net_inputs,
            outputs=net_outputs,
            extra=_batching(max_queue_delay_us) + extra,
        )
    platform = "onnxruntime_onnx" if net_backend == "onnxruntime" else "tensorrt_plan"
    # The graph's batch dimension is the one Triton batches along; num_detections
    # is [N, 1] in the graph, i.e. [1] per item.
    batching = _batching(max_queue_delay_us) if net_batch > 1 else ""
    return _config(
        name,
        backend=f'platform: "{platform}"',
        max_batch_size=net_batch,
        inputs=net_inputs,
        outputs=net_outputs,
        extra=batching + extra + accelerator,
    )
