"""Write an exported model into a Triton model repository as a four-model ensemble.

For a model ``NAME``, :func:`publish` writes (part names: :class:`EnsembleNames`, which
no user's model name can equal)::

    _NAME.preprocess/   config.pbtxt, <v>/{model.py, maskops_serving_ops.py, settings.json}
    _NAME.net/          config.pbtxt, <v>/{model.onnx, settings.json}
                        [+ <v>/{model.py, maskops_serving_ops.py} for the python backend]
                        [<v>/model.plan instead of model.onnx for the tensorrt backend]
    _NAME.postprocess/  config.pbtxt, <v>/{model.py, maskops_serving_ops.py, label_map.json}
    NAME/               config.pbtxt, <v>/label_map.json, label_map.json, versions.json

(the three parts are python-backend models, the network may instead run on Triton's
onnxruntime or TensorRT backend; ``NAME`` is the ensemble clients call).

Each python model is one folder per deployable model as in Triton's python_backend
examples: ``model.py`` builds its heavy objects in ``initialize`` and imports only the
``triton`` extra (numpy, Pillow, pycocotools, onnxruntime; ``triton-gpu`` has
onnxruntime-gpu instead) and the self-contained
``maskops_serving_ops.py`` copied next to it; never torch nor the maskops engine.

Clients send ``image_bytes`` (UINT8 ``[L]``, a JPEG/PNG) and ``score_threshold`` (FP32
``[1]``) and receive ``detections_json`` (UINT8 ``[L]``: COCO results as JSON text); see
:mod:`maskops.serving.protocol` (UINT8, not BYTES: the python backend's stub loses BYTES
tensors under numpy 2). Every publish adds version ``v`` (one more than any
version folder of the four models) to all four; each config serves the latest version
only, so loading the models again (:func:`maskops.serving.client.roll_out`) brings the new
version up next to the old one and retires the old one once it is ready: requests in
flight finish on the version they started on.

A publish is all or nothing: every version folder is written in a staging folder first,
then all are moved into place and the configs replaced; on any failure what was moved or
replaced is undone, so the repository is left as it was (:mod:`maskops.serving.versions`).
The configs are :mod:`maskops.serving.model_configs`'s.

Every model of the ensemble has dynamic batching up to ``max_batch_size`` (the export's
unless given): requests arriving together are preprocessed, run through the network as
one batch (the exported graph takes ``[N, 3, H, W]``, see :mod:`maskops.export.graph`)
and post-processed together.

Network backends (``net_backend``; the default follows the device, see
:mod:`maskops.serving.placement`):
- ``"python"`` (the default on CPU hosts, what the PyPI Triton here has): onnxruntime
  inside the python backend (its CUDA provider on GPU hosts); it also serves graphs of a
  static batch (filling the last run).
- ``"onnxruntime"`` (the default on GPU hosts): Triton's onnxruntime backend; on GPU hosts
  with the TensorRT accelerator, so that Triton builds the engine in-process with its own
  TensorRT at load time (publish works on a running Triton, nothing is built beforehand)
  and caches it outside the repository, per Triton process
  (:data:`~maskops.serving.placement.ENGINE_CACHE_ROOT`).
- ``"tensorrt"``: ``model.plan``, a TensorRT engine built beforehand by
  ``maskops gen_trt_engine`` (GPU hosts only). Publish takes it only with the record
  written next to it, and only when that record says it was built from this ONNX by the
  TensorRT of the Triton that will load it (:mod:`maskops.serving.engines`); otherwise
  it fails before anything is written or loaded.
The graph backends keep the same tensor names, so the ensemble is identical; both need a
dynamic-batch export, except that the tensorrt backend serves a graph of static batch 1
(exports made before batching, or ``--static_batch_size 1``) at max_batch_size 1. Triton's
onnxruntime backend refuses to load a graph whose first dimension is fixed under a
max_batch_size, so publish refuses one for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import onnx

from maskops.data.labels import LabelMap
from maskops.export.graph import GraphMetadata, read_metadata
from maskops.export.tensorrt_rules import check_tensorrt_graph, describe
from maskops.serving.engines import TRITON_TENSORRT_VERSION, EngineError, check_engine
from maskops.serving.model_configs import (
    NET_BACKENDS,
    InstanceCounts,
    NetBackend,
    PublishError,
    network_batch_size,
    render_configs,
)
from maskops.serving.placement import (
    ENGINE_CACHE_ROOT,
    PRECISIONS,
    Placement,
    engine_cache_folder,
)
from maskops.serving.protocol import (
    EnsembleNames,
    ImageLimits,
    InvalidModelName,
    check_model_name,
)
from maskops.serving.publish_options import NETWORK_QUEUE_DELAY_US
from maskops.serving.torch_publish import CHECKPOINT_FILENAME, NotACheckpoint, checkpoint_metadata
from maskops.serving.versions import (
    Content,
    existing_versions,
    next_version,
    read_history,
    remove_leftover_staging,
    write_version,
)
from maskops.spec.models import ExperimentSpec

MODELS_DIR = Path(__file__).parent / "triton_models"
TORCH_MODEL_FILE = Path(__file__).parent / "torch_network_model.py"
"""The torch backend's network ``model.py`` (it imports the engine, see its docstring)."""
OPS_FILE = MODELS_DIR / "maskops_serving_ops.py"
"""The self-contained processing module copied next to every python ``model.py``."""

__all__ = [
    "NET_BACKENDS",
    "EnsembleNames",
    "NetBackend",
    "Placement",
    "PublishError",
    "existing_versions",
    "publish",
    "render_configs",
]


def _check_name(name: str) -> None:
    try:
        check_model_name(name)
    except InvalidModelName as exc:
        raise PublishError(str(exc)) from None


def _find_onnx(export: Path) -> Path:
    if export.is_file():
        if export.suffix.lower() != ".onnx":
            raise PublishError(
                f"{export}: expected an exported .onnx file (a checkpoint is served by the "
                "torch net backend)"
            )
        return export
    if export.is_dir():
        found = sorted(export.glob("*.onnx"))
        if len(found) != 1:
            raise PublishError(
                f"{export}: expected exactly one .onnx in the folder, found {len(found)}"
            )
        return found[0]
    raise PublishError(f"{export}: no such export file or folder")


def _read_metadata(onnx_path: Path) -> GraphMetadata:
    try:
        meta = read_metadata(onnx_path)
    except (ValueError, KeyError) as exc:
        raise PublishError(str(exc)) from None
    except Exception as exc:
        # onnx raises protobuf's DecodeError (and others) on a truncated or foreign file.
        raise PublishError(f"{onnx_path}: not a readable ONNX file ({exc})") from None
    if meta.output_layout != "maskops":
        raise PublishError(
            f"{onnx_path}: has the {meta.output_layout!r} output layout (for TensorRT and "
            "DeepStream); the Triton ensemble serves the maskops layout: export again "
            "with --output_layout maskops"
        )
    return meta


def _version_files(
    names: EnsembleNames,
    meta: GraphMetadata,
    network: _Network,
    image_limits: ImageLimits | None = None,
) -> dict[str, dict[str, Content]]:
    """``{model: {filename: text or file to copy}}`` of the new version, ensemble last; the
    preprocess model's settings also hold ``image_limits`` (its ``initialize`` reads them)."""
    shared: dict[str, object] = {
        "image_size": list(meta.image_size),
        "data_type": meta.data_type,
        "max_batch_size": network.batch,
        "static_batch_size": meta.batch_size,
    }
    settings = json.dumps(shared)
    limits = image_limits.as_settings() if image_limits is not None else {}
    label_json = json.dumps(meta.label_map.to_json(), indent=1)
    files: dict[str, dict[str, Content]] = {
        names.preprocess: {
            "model.py": MODELS_DIR / "preprocess" / "model.py",
            OPS_FILE.name: OPS_FILE,
            "settings.json": json.dumps(shared | limits),
        },
        names.net: {network.filename: network.graph, "settings.json": settings},
        names.postprocess: {
            "model.py": MODELS_DIR / "postprocess" / "model.py",
            OPS_FILE.name: OPS_FILE,
            "label_map.json": label_json,
        },
        names.name: {"label_map.json": label_json},
    }
    if network.backend == "python":
        files[names.net]["model.py"] = MODELS_DIR / "network" / "model.py"
        files[names.net][OPS_FILE.name] = OPS_FILE
    if network.backend == "torch":
        net_settings = shared | {"precision": network.precision}
        files[names.net]["settings.json"] = json.dumps(net_settings)
        files[names.net]["model.py"] = TORCH_MODEL_FILE
    return files


@dataclass(frozen=True)
class _Network:
    """What the network model of a publish runs and from which file."""

    backend: NetBackend
    batch: int
    """Its Triton max_batch_size."""
    graph: Path
    """The file served: the ONNX, or the TensorRT engine."""
    filename: str
    """``graph``'s name in the version folder (``model.onnx`` or ``model.plan``)."""
    engine_cache: bool
    """Whether onnxruntime's TensorRT accelerator caches its engines."""
    precision: str
    """What the config records: the export's data type; the torch backend's autocast."""


def _resolve_network(
    onnx_path: Path,
    meta: GraphMetadata,
    net_backend: str | None,
    placement: Placement,
    *,
    max_batch_size: int | None,
    engine: Path | None,
    triton_tensorrt_version: str,
    precision: str = "auto",
) -> _Network:
    """The network of this publish; every check that needs no writing happens here.

    ``onnx_path`` is the checkpoint for the torch backend.

    Raises:
        PublishError: an unknown backend, tensorrt on the CPU, or a TensorRT engine that
            is missing or that the Triton cannot load (:func:`engines.check_engine`).
    """
    backend = _chosen_backend(net_backend, placement)
    batch = network_batch_size(meta, backend, max_batch_size or meta.max_batch_size)
    if backend == "torch":
        chosen = _torch_precision(precision, placement)
        return _Network(backend, batch, onnx_path, CHECKPOINT_FILENAME, False, chosen)
    if backend != "tensorrt":
        cache = backend == "onnxruntime" and placement.device == "gpu"
        if cache and meta.data_type == "int8":
            _check_int8_for_tensorrt(onnx_path)
        return _Network(backend, batch, onnx_path, "model.onnx", cache, meta.data_type)
    if placement.device != "gpu":
        raise PublishError("the tensorrt net backend runs on GPUs only: publish with device gpu")
    plan = engine if engine is not None else onnx_path.with_suffix(".engine")
    try:
        check_engine(
            plan,
            onnx_path=onnx_path,
            triton_tensorrt_version=triton_tensorrt_version,
            max_batch_size=batch,
        )
    except EngineError as exc:
        hint = "" if engine is not None else " (looked for the engine next to the ONNX)"
        raise PublishError(f"{exc}{hint}") from None
    return _Network(backend, batch, plan, "model.plan", False, meta.data_type)


def _chosen_backend(net_backend: str | None, placement: Placement) -> NetBackend:
    chosen = net_backend or placement.default_net_backend()
    if chosen not in NET_BACKENDS:
        raise PublishError(f"net backend {chosen!r}: expected one of {NET_BACKENDS}")
    return cast(NetBackend, chosen)


def _torch_precision(precision: str, placement: Placement) -> str:
    """The torch backend's precision as its config records it: ``auto`` stays (the GPU
    decides when the model loads) except on the CPU, which runs fp32 only."""
    if precision not in PRECISIONS:
        raise PublishError(f"precision {precision!r}: expected one of {PRECISIONS}")
    if placement.device == "cpu":
        if precision not in ("auto", "fp32"):
            raise PublishError(f"precision {precision}: autocast runs on GPUs only")
        return "fp32"
    return precision


def _check_int8_for_tensorrt(onnx_path: Path) -> None:
    """An int8 graph the TensorRT accelerator can take: TensorRT imports only symmetric
    int8 Q/DQ (zero points 0), which the export writes for ``target: tensorrt``.

    Raises:
        PublishError: the graph is the portable int8 export (uint8, asymmetric).
    """
    model = onnx.load(str(onnx_path), load_external_data=False)
    broken = [v for v in check_tensorrt_graph(model) if v.rule == "qdq-int8-symmetric"]
    if broken:
        raise PublishError(
            f"{onnx_path.name} is the portable int8 export (uint8 activations, asymmetric "
            "ranges), which the TensorRT accelerator of GPU serving cannot import: export "
            "it again with target tensorrt (symmetric int8), or publish it with device "
            f"cpu. {describe(broken, limit=1)}"
        )


def publish(
    export: Path,
    repository: Path,
    name: str,
    *,
    label_map: LabelMap | None = None,
    spec: ExperimentSpec | None = None,
    net_backend: NetBackend | None = None,
    placement: Placement | None = None,
    engine: Path | None = None,
    triton_tensorrt_version: str | None = None,
    engine_cache_root: str = ENGINE_CACHE_ROOT,
    max_batch_size: int | None = None,
    instances: int = 1,
    processing_instances: int = 1,
    max_queue_delay_us: int = NETWORK_QUEUE_DELAY_US,
    image_limits: ImageLimits | None = None,
    activate: Callable[[int], None] | None = None,
    precision: str = "auto",
) -> int:
    """Add the export as a new version of ``name`` in ``repository``; return the version.

    Args:
        export: an exported ``.onnx`` (or a folder holding exactly one); for the torch
            net backend, a train or prune job's checkpoint instead.
        repository: the Triton model repository root (created if missing).
        name: the ensemble's name clients call (:data:`protocol.MODEL_NAME_PATTERN`).
        label_map, spec: override what the export's metadata says (normally omitted).
        net_backend: "python", "onnxruntime" or "tensorrt" (see module doc); None: the
            placement's default (python on CPUs, onnxruntime with TensorRT on GPUs).
        placement: where the network runs (default: the CPU).
        engine: the TensorRT engine of the tensorrt backend (default: ``<onnx stem>.engine``
            next to the ONNX), with the record ``maskops gen_trt_engine`` writes.
        triton_tensorrt_version: the TensorRT of the Triton that loads the engine
            (default :data:`engines.TRITON_TENSORRT_VERSION`, the pinned image's).
        engine_cache_root: where each Triton process keeps the engines the TensorRT
            accelerator builds, as Triton sees it (see :data:`ENGINE_CACHE_ROOT`).
        max_batch_size: Triton max_batch_size (default: the export's).
        instances: the network's model instances (per GPU on GPUs).
        processing_instances: the preprocess and postprocess models' instances (each a
            process on the CPU).
        max_queue_delay_us: how long the network waits to fill a batch, in microseconds.
        image_limits: the preprocess model refuses larger images from their header,
            before decoding (the API's own limits: it may be called directly); None: none
            but Pillow's.
        activate: called with the new version once it is written (to load it in Triton);
            if it raises, the publish is undone and the exception propagates.
        precision: the torch backend's (:data:`placement.PRECISIONS`; ``auto``: bf16 on
            GPUs with native bf16, fp16 on other GPUs, fp32 on the CPU).

    All or nothing: the version folders are complete (staged, then moved) before the
    configs change, and any failure undoes every move and write, so the repository is
    left byte for byte as it was. Nothing is loaded here: call
    :func:`maskops.serving.client.roll_out` (or restart Triton) to serve it.

    Raises:
        PublishError: bad name, backend or engine, not a maskops export, unreadable
            history, or the repository could not be written (then it is unchanged).
    """
    _check_name(name)
    if min(instances, processing_instances) < 1:
        raise PublishError(
            f"instances {instances}, processing_instances {processing_instances}: "
            "each model needs at least one instance"
        )
    if max_queue_delay_us < 0:
        raise PublishError(f"max_queue_delay_us {max_queue_delay_us}: must be 0 or more")
    placement = placement or Placement()
    backend = _chosen_backend(net_backend, placement)
    onnx_path, meta = _source_metadata(Path(export), backend, label_map, spec, max_batch_size)
    network = _resolve_network(
        onnx_path,
        meta,
        backend,
        placement,
        max_batch_size=max_batch_size,
        engine=engine,
        triton_tensorrt_version=triton_tensorrt_version or TRITON_TENSORRT_VERSION,
        precision=precision,
    )
    names, repository = EnsembleNames(name), Path(repository)
    history = read_history(repository / name / "versions.json")
    version = next_version(repository, names)
    cache = engine_cache_folder(engine_cache_root, names.net, version)
    configs = render_configs(
        names,
        meta,
        net_backend=network.backend,
        max_batch_size=max_batch_size,
        instances=InstanceCounts(network=instances, processing=processing_instances),
        max_queue_delay_us=max_queue_delay_us,
        placement=placement,
        engine_cache=cache if network.engine_cache else None,
        precision=network.precision,
    )
    history.append(_history_entry(version, onnx_path, meta, network, placement))
    files = _version_files(names, meta, network, image_limits)
    write_version(repository, names, version, files, configs, history, meta, activate)
    remove_leftover_staging(repository, names)
    return version


def _source_metadata(
    export: Path,
    backend: NetBackend,
    label_map: LabelMap | None,
    spec: ExperimentSpec | None,
    max_batch_size: int | None,
) -> tuple[Path, GraphMetadata]:
    """The file the network serves (the export's ONNX; the checkpoint for the torch
    backend) and its metadata, with ``label_map`` and ``spec`` in place of its own where
    given."""
    if backend == "torch":
        try:
            meta = checkpoint_metadata(export, max_batch_size=max_batch_size)
        except NotACheckpoint as exc:
            raise PublishError(str(exc)) from None
        onnx_path = export
    else:
        onnx_path = _find_onnx(export)
        meta = _read_metadata(onnx_path)
    if label_map is not None or spec is not None:
        meta = replace(meta, spec=spec or meta.spec, label_map=label_map or meta.label_map)
    return onnx_path, meta


def _history_entry(
    version: int, onnx_path: Path, meta: GraphMetadata, network: _Network, placement: Placement
) -> dict[str, Any]:
    """The version's line in ``versions.json``."""
    entry: dict[str, Any] = {
        "version": version,
        "onnx": str(onnx_path),
        "data_type": meta.data_type,
        "image_size": list(meta.image_size),
        "net_backend": network.backend,
        "device": placement.device,
        "precision": network.precision,
    }
    if network.backend == "tensorrt":
        entry["engine"] = str(network.graph)
    return entry
