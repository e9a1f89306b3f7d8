"""Write an exported model into a Triton model repository as a four-model ensemble.

For a model ``NAME``, :func:`publish` writes::

    NAME_preprocess/   config.pbtxt, <v>/model.py, <v>/settings.json    python backend
    NAME_net/          config.pbtxt, <v>/model.onnx [, <v>/model.py]    python|onnxruntime|tensorrt
    NAME_postprocess/  config.pbtxt, <v>/model.py, <v>/label_map.json   python backend
    NAME/              config.pbtxt, <v>/, label_map.json, versions.json   the ensemble

Clients send ``image_bytes`` (BYTES ``[1]``, a JPEG/PNG) and ``score_threshold`` (FP32
``[1]``) and receive ``detections_json`` (BYTES ``[1]``: COCO results). Every publish adds
version ``v = previous + 1`` to all four models; each config serves the latest version only,
so loading the models again (:func:`maskops.serving.client.roll_out`) brings the new
version up next to the old one and retires the old one once it is ready: requests in
flight finish on the version they started on.

Network backends (``net_backend``):
- ``"python"`` (default, what the PyPI Triton here has): onnxruntime inside the python
  backend, dynamic batching of up to ``max_batch_size`` images, one graph run per image.
- ``"onnxruntime"``: Triton's onnxruntime backend (official image), batch 1.
- ``"tensorrt"``: ``model.plan`` built from ``model.onnx`` at container start
  (services/triton/entrypoint.sh), batch 1. Both keep the same tensor names, so the
  ensemble is identical.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from maskops.data.labels import LabelMap
from maskops.export.graph import GraphMetadata, read_metadata
from maskops.spec.models import ExperimentSpec

NetBackend = Literal["python", "onnxruntime", "tensorrt"]
NET_BACKENDS: tuple[str, ...] = ("python", "onnxruntime", "tensorrt")
MODELS_DIR = Path(__file__).parent / "triton_models"


class PublishError(ValueError):
    """The export cannot be published (missing file, bad name, not a maskops export)."""


@dataclass(frozen=True)
class EnsembleNames:
    """The four Triton model names of a published model."""

    name: str

    @property
    def preprocess(self) -> str:
        return f"{self.name}_preprocess"

    @property
    def net(self) -> str:
        return f"{self.name}_net"

    @property
    def postprocess(self) -> str:
        return f"{self.name}_postprocess"

    @property
    def load_order(self) -> tuple[str, str, str, str]:
        """Composing models first, the ensemble last."""
        return (self.preprocess, self.net, self.postprocess, self.name)


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or not name[0].isalnum():
        raise PublishError(
            f"model name {name!r}: use letters, digits, '-', '_' and '.', starting with a "
            "letter or digit"
        )


def _dims(values: tuple[int, ...] | list[int]) -> str:
    return "[ " + ", ".join(str(v) for v in values) + " ]"


def _tensor(name: str, dtype: str, dims: tuple[int, ...] | list[int]) -> str:
    return f'  {{ name: "{name}" data_type: {dtype} dims: {_dims(dims)} }}'


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


def _net_tensors(meta: GraphMetadata) -> tuple[list[str], list[str]]:
    d, m = meta.max_detections, meta.mask_resolution
    inputs = [_tensor("images", "TYPE_FP32", (3, *meta.image_size))]
    outputs = [
        _tensor("boxes", "TYPE_FP32", (d, 4)),
        _tensor("scores", "TYPE_FP32", (d,)),
        _tensor("labels", "TYPE_INT64", (d,)),
        _tensor("masks", "TYPE_FP32", (d, m, m)),
        _tensor("num_detections", "TYPE_INT32", (1,)),
    ]
    return inputs, outputs


def _batching(max_queue_delay_us: int) -> str:
    return f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}\n"


def _instances(count: int, kind: str = "KIND_CPU") -> str:
    return f"instance_group [ {{ kind: {kind} count: {count} }} ]\n"


def render_configs(
    names: EnsembleNames,
    meta: GraphMetadata,
    *,
    net_backend: NetBackend = "python",
    max_batch_size: int | None = None,
    instances: int = 1,
    max_queue_delay_us: int = 2000,
) -> dict[str, str]:
    """``{triton model name: config.pbtxt text}`` for the four models."""
    batch = max_batch_size or meta.max_batch_size
    net_batch = batch if net_backend == "python" else 1
    ensemble_batch = min(batch, net_batch)
    net_inputs, net_outputs = _net_tensors(meta)
    image_outputs = [
        _tensor("images", "TYPE_FP32", (3, *meta.image_size)),
        _tensor("scale", "TYPE_FP32", (1,)),
        _tensor("orig_hw", "TYPE_INT32", (2,)),
    ]
    configs = {
        names.preprocess: _config(
            names.preprocess,
            backend='backend: "python"',
            max_batch_size=batch,
            inputs=[_tensor("image_bytes", "TYPE_STRING", (1,))],
            outputs=image_outputs,
            extra=_batching(max_queue_delay_us) + _instances(instances),
        ),
        names.postprocess: _config(
            names.postprocess,
            backend='backend: "python"',
            max_batch_size=batch,
            inputs=[
                *net_outputs,
                *image_outputs[1:],
                _tensor("score_threshold", "TYPE_FP32", (1,)),
            ],
            outputs=[_tensor("detections_json", "TYPE_STRING", (1,))],
            extra=_batching(max_queue_delay_us) + _instances(instances),
        ),
    }
    if net_backend == "python":
        configs[names.net] = _config(
            names.net,
            backend='backend: "python"',
            max_batch_size=net_batch,
            inputs=net_inputs,
            outputs=net_outputs,
            extra=_batching(max_queue_delay_us) + _instances(instances),
        )
    else:
        platform = "onnxruntime_onnx" if net_backend == "onnxruntime" else "tensorrt_plan"
        # The graph's own batch dimension is the 1 Triton batches along; num_detections
        # is [1, 1] in the graph, i.e. [1] per item.
        configs[names.net] = _config(
            names.net,
            backend=f'platform: "{platform}"',
            max_batch_size=net_batch,
            inputs=net_inputs,
            outputs=net_outputs,
            extra=_instances(instances, "KIND_GPU"),
        )

    def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
        ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
        outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
        return f'    {{ model_name: "{model}" model_version: -1 {ins} {outs} }}'

    image_keys = {"images": "_images", "scale": "_scale", "orig_hw": "_orig_hw"}
    detection_keys = {k: f"_{k}" for k in ("boxes", "scores", "labels", "masks", "num_detections")}
    steps = [
        step(names.preprocess, {"image_bytes": "image_bytes"}, image_keys),
        step(names.net, {"images": "_images"}, detection_keys),
        step(
            names.postprocess,
            {
                **detection_keys,
                "scale": "_scale",
                "orig_hw": "_orig_hw",
                "score_threshold": "score_threshold",
            },
            {"detections_json": "detections_json"},
        ),
    ]
    configs[names.name] = _config(
        names.name,
        backend='platform: "ensemble"',
        max_batch_size=ensemble_batch,
        inputs=[
            _tensor("image_bytes", "TYPE_STRING", (1,)),
            _tensor("score_threshold", "TYPE_FP32", (1,)),
        ],
        outputs=[_tensor("detections_json", "TYPE_STRING", (1,))],
        extra="ensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}\n",
    )
    return configs


def existing_versions(repository: Path, name: str) -> list[int]:
    """Published versions of ``name`` (numbered folders of the ensemble), ascending."""
    folder = repository / name
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def _find_onnx(export: Path) -> Path:
    if export.is_file():
        if export.suffix.lower() != ".onnx":
            raise PublishError(f"{export}: expected an exported .onnx file")
        return export
    if export.is_dir():
        found = sorted(export.glob("*.onnx"))
        if len(found) != 1:
            raise PublishError(
                f"{export}: expected exactly one .onnx in the folder, found {len(found)}"
            )
        return found[0]
    raise PublishError(f"{export}: no such export file or folder")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def publish(
    export: Path,
    repository: Path,
    name: str,
    *,
    label_map: LabelMap | None = None,
    spec: ExperimentSpec | None = None,
    net_backend: NetBackend = "python",
    max_batch_size: int | None = None,
    instances: int = 1,
) -> int:
    """Add the export as a new version of ``name`` in ``repository``; return the version.

    Args:
        export: an exported ``.onnx`` (or a folder holding exactly one).
        repository: the Triton model repository root (created if missing).
        name: the ensemble's name clients call.
        label_map, spec: override what the export's metadata says (normally omitted).
        net_backend: "python" (onnxruntime in the python backend), "onnxruntime" or
            "tensorrt" (official Triton image; see module doc).
        max_batch_size: Triton max_batch_size (default: the export's).
        instances: model instances per composing model.

    Files of the new version are complete before the configs change, so a Triton polling
    the repository never sees a half-written version. Nothing is loaded here: call
    :func:`maskops.serving.client.roll_out` (or restart Triton) to serve it.
    """
    _check_name(name)
    if net_backend not in NET_BACKENDS:
        raise PublishError(f"net backend {net_backend!r}: expected one of {NET_BACKENDS}")
    onnx_path = _find_onnx(Path(export))
    try:
        meta = read_metadata(onnx_path)
    except (ValueError, KeyError) as exc:
        raise PublishError(str(exc)) from None
    if label_map is not None or spec is not None:
        meta = GraphMetadata(
            spec=spec or meta.spec,
            label_map=label_map or meta.label_map,
            data_type=meta.data_type,
            image_size=meta.image_size,
            max_detections=meta.max_detections,
            mask_resolution=meta.mask_resolution,
            max_batch_size=meta.max_batch_size,
        )
    names = EnsembleNames(name)
    repository = Path(repository)
    repository.mkdir(parents=True, exist_ok=True)
    version = max([0, *existing_versions(repository, name)]) + 1
    settings = {"image_size": list(meta.image_size), "data_type": meta.data_type}
    label_json = json.dumps(meta.label_map.to_json(), indent=1)
    files: dict[str, dict[str, str | Path]] = {
        names.preprocess: {
            "model.py": MODELS_DIR / "preprocess.py",
            "settings.json": json.dumps(settings),
        },
        names.net: {"model.onnx": onnx_path, "settings.json": json.dumps(settings)},
        names.postprocess: {
            "model.py": MODELS_DIR / "postprocess.py",
            "label_map.json": label_json,
        },
        names.name: {"label_map.json": label_json},
    }
    if net_backend == "python":
        files[names.net]["model.py"] = MODELS_DIR / "network.py"
    # Version folders are written under a temporary name and renamed into place.
    for model, contents in files.items():
        final = repository / model / str(version)
        staging = repository / model / f".{version}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for filename, content in contents.items():
            if isinstance(content, Path):
                shutil.copyfile(content, staging / filename)
            else:
                (staging / filename).write_text(content)
        staging.rename(final)
    configs = render_configs(
        names, meta, net_backend=net_backend, max_batch_size=max_batch_size, instances=instances
    )
    for model, text in configs.items():
        _write_atomic(repository / model / "config.pbtxt", text)
    _write_atomic(repository / name / "label_map.json", label_json)
    history_path = repository / name / "versions.json"
    history = json.loads(history_path.read_text()) if history_path.exists() else []
    history.append(
        {
            "version": version,
            "onnx": str(onnx_path),
            "data_type": meta.data_type,
            "image_size": list(meta.image_size),
            "net_backend": net_backend,
        }
    )
    _write_atomic(history_path, json.dumps(history, indent=1))
    return version
