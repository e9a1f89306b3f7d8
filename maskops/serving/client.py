"""Talk to Triton over HTTP: infer encoded images, load/unload/roll out models, health.

Imports only tritonclient, numpy and :mod:`maskops.serving.protocol`: the API image has
no torch nor onnx (tests/unit/serving/test_light_imports.py checks it).

Errors are typed so that the API can answer precisely: :class:`TritonUnavailable` (503),
:class:`ModelNotFound` (404), :class:`InvalidImage` (400, the message names the image),
anything else :class:`InferenceFailed` (502). Every message is one line.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from maskops.serving.control import CONTROL_KEY_ENV, control_headers
from maskops.serving.protocol import (
    DETECTIONS_JSON,
    IMAGE_BYTES,
    NET_PARAMETERS,
    SCORE_THRESHOLD,
    EnsembleNames,
    decode_detections,
)


class TritonError(RuntimeError):
    """Base of the client's errors."""


class TritonUnavailable(TritonError):
    """Triton does not answer (not started, crashed, wrong URL)."""


class TritonTimeout(TritonUnavailable):
    """Triton took the request but did not answer within the call's time (stalled,
    overloaded)."""


class ModelNotFound(TritonError):
    """The model (or version) is unknown or not loaded."""


class InvalidImage(TritonError):
    """An input is not a decodable image."""


class InferenceFailed(TritonError):
    """Triton answered with another error."""


class ControlRefused(TritonError):
    """Triton refused model control: this process lacks the server's control key."""


def _strip_scheme(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


@contextlib.contextmanager
def _client(url: str, *, concurrency: int = 1, timeout_s: float = 60.0) -> Iterator[Any]:
    client = httpclient.InferenceServerClient(
        _strip_scheme(url),
        concurrency=max(1, concurrency),
        # A replica that is gone must not hold a request for the whole call's timeout:
        # the caller moves on to another (maskops.serving.replicas).
        connection_timeout=min(timeout_s, 10.0),
        network_timeout=timeout_s,
    )
    try:
        yield client
    finally:
        # Connections must be closed before Triton is stopped (docs/architecture.md).
        client.close()


def _translate(exc: Exception, model: str, version: str) -> TritonError:
    """Map a tritonclient/socket exception to one of this module's errors."""
    if isinstance(exc, ConnectionError | socket.error | TimeoutError):
        return TritonUnavailable(f"Triton is not reachable: {exc}")
    message = exc.message() if isinstance(exc, InferenceServerException) else str(exc)
    message = " ".join(str(message).split())
    lowered = message.lower()
    if any(
        marker in lowered
        for marker in (
            "unreadable image",
            "not an image",
            "cannot identify",
            "or png expected",
            "above this model's limit",  # pixels (the preprocess model's own limit)
        )
    ):
        return InvalidImage(message)
    if "unknown model" in lowered or "is not found" in lowered or "not ready" in lowered:
        where = f"{model}" + (f" version {version}" if version else "")
        return ModelNotFound(f"model {where} is not loaded in Triton: {message}")
    if "restricted" in lowered and "header" in lowered:
        return ControlRefused(
            f"Triton refused to control {model}: set {CONTROL_KEY_ENV} to the server's "
            f"model-control key ({message})"
        )
    if "connect" in lowered or "connection" in lowered:
        return TritonUnavailable(f"Triton is not reachable: {message}")
    return InferenceFailed(message)


def is_ready(
    url: str, model: str | None = None, *, version: str = "", timeout_s: float = 5.0
) -> bool:
    """Whether the server (or ``model``) is ready; False when Triton is unreachable or
    does not answer within ``timeout_s``."""
    try:
        with _client(url, timeout_s=timeout_s) as client:
            if model is None:
                return bool(client.is_server_ready())
            return bool(client.is_model_ready(model, version))
    except Exception:
        return False


def _call(url: str, model: str, action: str) -> None:
    try:
        with _client(url, timeout_s=600.0) as client:
            getattr(client, action)(model, headers=control_headers())
    except Exception as exc:
        raise _translate(exc, model, "") from None


def load_model(url: str, model: str) -> None:
    """(Re)load ``model`` from the repository (explicit model control).

    A newer version is loaded next to the serving one, which is unloaded once the new one
    is ready; requests in flight finish on the version they started on.
    """
    _call(url, model, "load_model")


def unload_model(url: str, model: str) -> None:
    _call(url, model, "unload_model")


def roll_out(url: str, name: str, version: int | None = None) -> None:
    """Serve the newest published version of ensemble ``name``.

    Loading an ensemble in explicit mode (re)loads its composing models with it (measured:
    loading them one by one first only makes Triton load them twice). Each model's new
    version comes up next to the serving one, which is unloaded once it is ready.

    Triton answers the ensemble's load with success even when a composing model failed to
    load (measured with Triton 2.51: the part then serves nothing at all), so with
    ``version`` every part is checked to serve it.

    Raises:
        InferenceFailed: a part does not serve ``version`` after the load.
    """
    load_model(url, name)
    if version is None:
        return
    wrong = {
        model: served
        for model in EnsembleNames(name).load_order
        if (served := served_version(url, model)) != str(version)
    }
    if wrong:
        listed = ", ".join(f"{m} serves {v or 'nothing'}" for m, v in wrong.items())
        raise InferenceFailed(f"version {version} of {name} did not load: {listed}")


def retire(url: str, name: str) -> None:
    """Stop serving ensemble ``name`` (the ensemble first, then its parts)."""
    for model in reversed(EnsembleNames(name).load_order):
        unload_model(url, model)


def model_states(url: str, model: str) -> dict[str, str]:
    """Version -> state (``READY``, ``UNAVAILABLE``, ``LOADING``...) of each version of
    ``model`` Triton knows (its repository index)."""
    try:
        with _client(url, timeout_s=10.0) as client:
            index = client.get_model_repository_index(headers=control_headers())
    except Exception as exc:
        raise _translate(exc, model, "") from None
    return {
        str(e["version"]): str(e.get("state", ""))
        for e in index
        if e.get("name") == model and e.get("version")
    }


def served_version(url: str, model: str) -> str | None:
    """The version of ``model`` Triton serves (READY in the repository index), or None."""
    ready = [v for v, state in model_states(url, model).items() if state == "READY"]
    return max(ready, key=int) if ready else None


def _encoded_datatype(client: Any, model: str, version: str) -> str:
    """How the served version carries the encoded image: UINT8, or BYTES (versions
    published before, see :data:`protocol.ENCODED_DATATYPES`)."""
    metadata = client.get_model_metadata(model, version)
    for tensor in metadata.get("inputs", []):
        if tensor.get("name") == IMAGE_BYTES:
            return str(tensor.get("datatype", "UINT8"))
    return "UINT8"


def network_placement(
    url: str, name: str, *, version: str = "", timeout_s: float = 10.0
) -> dict[str, str] | None:
    """Where the network of published model ``name`` runs, from its loaded config:
    ``{"net_backend", "device", "precision"}``; None for a version published before the
    config recorded it.

    Raises:
        TritonUnavailable, ModelNotFound: Triton is away, or the network is not loaded.
    """
    net = EnsembleNames(name).net
    with _client(url, timeout_s=timeout_s) as client:
        return _placement(_loaded_config(client, net, version))


@dataclass(frozen=True)
class ServedLayout:
    """How Triton runs one version of a published model, from its loaded configs."""

    network: dict[str, str] | None
    """Where the network runs (:func:`network_placement`)."""
    instances: dict[str, int]
    """Instances of ``preprocess``, ``network`` and ``postprocess``; a GPU group's count
    is per GPU, so it counts once for each GPU the group names."""


def served_layout(
    url: str, name: str, *, version: str = "", timeout_s: float = 10.0
) -> ServedLayout:
    """Where the network of published model ``name`` runs and how many instances of each
    of its models Triton runs, each config read once.

    Raises:
        TritonUnavailable, ModelNotFound: Triton is away, or a model is not loaded.
    """
    parts = ("preprocess", "network", "postprocess")
    with _client(url, timeout_s=timeout_s) as client:
        configs = {
            part: _loaded_config(client, model, version)
            for part, model in zip(parts, EnsembleNames(name).parts, strict=True)
        }
    instances = {
        part: sum(
            int(group.get("count", 1)) * max(1, len(group.get("gpus", [])))
            for group in config.get("instance_group", [])
        )
        for part, config in configs.items()
    }
    return ServedLayout(network=_placement(configs["network"]), instances=instances)


def _loaded_config(client: Any, model: str, version: str) -> dict[str, Any]:
    try:
        return dict(client.get_model_config(model, version))
    except Exception as exc:
        raise _translate(exc, model, version) from None


def _placement(config: dict[str, Any]) -> dict[str, str] | None:
    parameters = config.get("parameters", {})
    found = {
        ours: str(parameters[key].get("string_value", ""))
        for key, ours in NET_PARAMETERS.items()
        if key in parameters
    }
    return found or None


def _request(image: bytes, score_threshold: float, datatype: str = "UINT8") -> list[Any]:
    if datatype == "BYTES":
        data = httpclient.InferInput(IMAGE_BYTES, [1, 1], "BYTES")
        data.set_data_from_numpy(np.array([[image]], dtype=np.object_), binary_data=True)
    else:
        data = httpclient.InferInput(IMAGE_BYTES, [1, len(image)], "UINT8")
        data.set_data_from_numpy(np.frombuffer(image, dtype=np.uint8)[None], binary_data=True)
    threshold = httpclient.InferInput(SCORE_THRESHOLD, [1, 1], "FP32")
    threshold.set_data_from_numpy(np.array([[score_threshold]], dtype=np.float32))
    return [data, threshold]


def infer_images(
    url: str,
    model: str,
    images: Sequence[bytes],
    *,
    score_threshold: float = 0.0,
    version: str = "",
    timeout_s: float = 120.0,
) -> list[list[dict[str, Any]]]:
    """COCO results for each encoded image, via the published ensemble ``model``.

    Images go as concurrent single-image requests (Triton batches them dynamically), so
    one bad image fails the call with :class:`InvalidImage` naming its position.

    Args:
        url: Triton's HTTP endpoint, ``host:port`` (an ``http://`` prefix is accepted).
        images: JPEG/PNG bytes.
        score_threshold: detections scoring below this are dropped.
        version: a specific version ("" = the served one).
        timeout_s: the whole call's time, all images together; past it
            :class:`TritonTimeout` (Triton is not waited for longer).

    Returns:
        Per image, the COCO results: ``image_id`` (the image's position in ``images``),
        ``category_id``, ``category_name``, ``bbox`` ``[x, y, w, h]`` original pixels,
        ``score``, ``segmentation`` (compressed RLE ``{"size", "counts"}``).
    """
    if not images:
        return []
    output = httpclient.InferRequestedOutput(DETECTIONS_JSON, binary_data=True)
    results: list[list[dict[str, Any]]] = []
    deadline = time.monotonic() + timeout_s
    try:
        with _client(url, concurrency=len(images), timeout_s=timeout_s) as client:
            datatype = _encoded_datatype(client, model, version)
            pending = [
                client.async_infer(
                    model,
                    _request(image, score_threshold, datatype),
                    model_version=version,
                    outputs=[output],
                )
                for image in images
            ]
            for index, handle in enumerate(pending):
                try:
                    answer = handle.get_result(timeout=max(0.0, deadline - time.monotonic()))
                except InferenceServerException as exc:
                    if time.monotonic() >= deadline:
                        raise _timed_out(timeout_s) from None
                    error = _translate(exc, model, version)
                    if isinstance(error, InvalidImage):
                        raise InvalidImage(f"image {index}: {error}") from None
                    raise error from None
                raw = answer.as_numpy(DETECTIONS_JSON)
                text = raw.tobytes() if raw.dtype == np.uint8 else raw.reshape(-1)[0]
                detections = decode_detections(text)
                for detection in detections:
                    detection["image_id"] = index
                results.append(detections)
    except TritonError:
        raise
    except Exception as exc:
        # A socket's own timeout (``network_timeout``) ends a stalled request too.
        if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
            raise _timed_out(timeout_s) from None
        raise _translate(exc, model, version) from None
    return results


def _timed_out(timeout_s: float) -> TritonTimeout:
    return TritonTimeout(f"Triton did not answer within {timeout_s:g} s")
