"""Spec conversions for the API: JSON or TAO text in, ``ExperimentSpec`` out, text back.

Both directions are the spec engineer's functions in :mod:`maskops.spec`; this module only
turns every failure into :class:`SpecError`, which the API answers with 422 and its
field/line message.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import maskops.spec as spec_pkg
from maskops.data.limits import MAX_INSTANCES
from maskops.spec.errors import SpecError
from maskops.spec.models import ExperimentSpec
from maskops.spec.weights_reference import is_url, is_weights_name
from maskops_core.paths import check_client_path

__all__ = [
    "SpecError",
    "check_limits",
    "check_paths",
    "check_trackers",
    "spec_from_json",
    "spec_from_text",
    "spec_to_text",
]

# What this service agrees to run, beyond what the engine's spec model checks: values the
# engine accepts but a worker cannot hold in memory (num_classes 10^9 made one try to
# allocate a terabyte). API-only, so the engine's models stay TAO's. MAX_INSTANCES is
# maskops.data.limits': the dataset readers keep no more objects of one image either.
MAX_NUM_CLASSES = 4096
MAX_BATCH_SIZE = 256
MAX_IMAGE_SIDE = 4096
MAX_BATCH_PIXELS = 2**27
"""Images of a batch together (batch x height x width): 32 images of 2048 x 2048."""


def check_limits(spec: ExperimentSpec, *, source: str) -> None:
    """Raise :class:`SpecError` naming the first field beyond what a worker can hold."""
    data = spec.data_config
    height, width = data.image_size
    checks: list[tuple[str, int, int]] = [
        ("data_config.num_classes", data.num_classes, MAX_NUM_CLASSES),
        ("data_config.max_num_instances", data.max_num_instances, MAX_INSTANCES),
        ("train_batch_size", spec.train_batch_size, MAX_BATCH_SIZE),
        ("eval_batch_size", spec.eval_batch_size, MAX_BATCH_SIZE),
        ("data_config.image_size", max(height, width), MAX_IMAGE_SIDE),
    ]
    for field, value, limit in checks:
        if value > limit:
            raise SpecError(
                f"{value} is above this server's limit of {limit}", source=source, field=field
            )
    for field, batch in (
        ("train_batch_size", spec.train_batch_size),
        ("eval_batch_size", spec.eval_batch_size),
    ):
        if batch * height * width > MAX_BATCH_PIXELS:
            raise SpecError(
                f"{batch} images of {height} x {width} exceed this server's limit of "
                f"{MAX_BATCH_PIXELS} pixels per batch",
                source=source,
                field=field,
            )


def check_paths(spec: ExperimentSpec, *, source: str, allowed_dirs: Sequence[Path]) -> None:
    """Raise :class:`SpecError` naming the first path field that leaves the data root
    (``checkpoint`` may also name the operator's pretrained weights, ``allowed_dirs``, or
    torchvision weights by name; a URL is refused: the server would fetch it)."""
    fields = [(name, getattr(spec, name), allowed_dirs) for name in spec.PATH_FIELDS]
    data = spec.data_config
    fields += [(f"data_config.{name}", getattr(data, name), ()) for name in data.PATH_FIELDS]
    for field, value, allowed in fields:
        if not value or (field == "checkpoint" and is_weights_name(value)):
            continue  # a torchvision weights name: its URL is torchvision's, not the client's
        if field == "checkpoint" and is_url(value):
            raise SpecError(
                f"{value!r}: a server fetches no URL a client names; name torchvision weights "
                "(maskops weights list), or a file the operator placed (maskops weights pull)",
                source=source,
                field=field,
            )
        try:
            check_client_path(value, allowed_dirs=allowed if field == "checkpoint" else ())
        except ValueError as exc:
            raise SpecError(f"{value!r} {exc}", source=source, field=field) from None


TRACKER_DESTINATIONS = ("mlflow_config.tracking_uri", "wandb_config.wandb_dir")
"""Spec fields that name where a tracker writes: over REST they are the operator's
(``MLFLOW_TRACKING_URI``, ``WANDB_BASE_URL``... on the workers; local stores under the
job's folder), never a client's (a URL the worker would call, a directory anywhere)."""


def check_trackers(spec: ExperimentSpec, *, source: str, allowed: Sequence[str]) -> None:
    """Raise :class:`SpecError` naming a tracker the operator does not allow
    (``MASKOPS_TRACKERS``) or a field that names a tracker's destination."""
    for block in spec.enabled_trackers:
        tracker = block.removesuffix("_config")
        if tracker not in allowed:
            offered = ", ".join(allowed) or "none"
            raise SpecError(
                f"this server does not allow the {tracker} tracker (allowed: {offered}; "
                "MASKOPS_TRACKERS)",
                source=source,
                field=block,
            )
    for field in TRACKER_DESTINATIONS:
        block, name = field.split(".")
        config = getattr(spec, block)
        if config is not None and getattr(config, name):
            raise SpecError(
                "tracker destinations are set by the operator on the workers, not by a "
                "spec sent over REST; remove the field",
                source=source,
                field=field,
            )


def spec_from_json(data: dict[str, Any]) -> ExperimentSpec:
    convert = getattr(spec_pkg, "spec_from_json", None)
    if convert is not None:
        result: ExperimentSpec = convert(data, source="spec")
        return result
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise SpecError(first["msg"], source="spec", field=field) from None


def spec_from_text(text: str) -> ExperimentSpec:
    parse = getattr(spec_pkg, "parse_spec_text", None)
    if parse is None:
        raise SpecError("TAO text specs are not supported by this build", source="spec_text")
    result: ExperimentSpec = parse(text, source="spec_text")
    return result


def spec_to_text(spec: ExperimentSpec) -> str:
    render = getattr(spec_pkg, "spec_to_text", None)
    if render is None:
        raise SpecError("rendering specs as TAO text is not supported by this build")
    text: str = render(spec)
    return text
