"""Validate spec data (from text or JSON) into an :class:`ExperimentSpec`, errors as SpecError.

All checks live in the pydantic models (:mod:`maskops.spec.models`); this module runs them
and turns the first failure into a one-line :class:`SpecError` naming the field's dotted path
and, when the spec came from text, the line where that field is written.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from maskops.spec.errors import FieldIssue, SpecError
from maskops.spec.models import (
    ClearMLConfig,
    DataConfig,
    ExperimentSpec,
    MaskRCNNConfig,
    MLflowConfig,
    WandBConfig,
)

FieldPath = tuple[str, ...]
"""A field's path from the top of the spec: ``("maskrcnn_config", "nlayers")``."""

BLOCKS: dict[FieldPath, type[BaseModel]] = {
    (): ExperimentSpec,
    ("data_config",): DataConfig,
    ("maskrcnn_config",): MaskRCNNConfig,
    ("wandb_config",): WandBConfig,
    ("clearml_config",): ClearMLConfig,
    ("mlflow_config",): MLflowConfig,
}
"""Each block (message) of the spec and the model holding its fields."""

TAO_UNSUPPORTED: dict[str, str] = {}
"""Top-level TAO fields that maskops does not implement, and what to do instead (TAO 5.3's
mask_rcnn fields are all implemented; the check stays for fields a later TAO adds)."""

_CLOSE = 0.6
"""difflib similarity from which a field name counts as a likely typo."""


def _where(block: FieldPath) -> str:
    return f"in {'.'.join(block)}" if block else "at the top level"


def unknown_field_message(name: str, block: FieldPath) -> str:
    """Why ``name`` is not accepted in ``block``: a misplaced field, a TAO field maskops does
    not implement, or a typo (with the closest valid name)."""
    if not block and name in TAO_UNSUPPORTED:
        return f"TAO field not supported by maskops ({TAO_UNSUPPORTED[name]}); remove it"
    for other, model in BLOCKS.items():
        if other != block and name in model.model_fields:
            return f"unknown field {_where(block)}; it belongs {_where(other)}"
    close = _closest_field(name, block)
    return "unknown field" + (f" (did you mean '{close}'?)" if close else "")


def _closest_field(name: str, block: FieldPath) -> str | None:
    """The valid field ``name`` most likely means: a field of ``block`` by its name, or of
    another block by its dotted path (a misspelt field in the wrong block). None if none is
    close; on a tie, ``block``'s own field wins."""
    best: tuple[float, bool, str] | None = None
    for other, model in BLOCKS.items():
        for field in model.model_fields:
            own = other == block
            score = difflib.SequenceMatcher(None, name, field).ratio()
            candidate = (score, own, field if own else ".".join((*other, field)))
            if score >= _CLOSE and (best is None or candidate[:2] > best[:2]):
                best = candidate
    return best[2] if best else None


def render_path(loc: tuple[str | int, ...]) -> str:
    """``maskrcnn_config.aspect_ratios[1][0]`` for a pydantic location."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _field_path(loc: tuple[str | int, ...]) -> FieldPath:
    return tuple(part for part in loc if isinstance(part, str))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(error: ErrorDetails, *, source: str, lines: Mapping[FieldPath, int]) -> SpecError:
    loc = tuple(error["loc"])
    raised = (error.get("ctx") or {}).get("error")
    candidates: list[FieldPath]
    if isinstance(raised, FieldIssue):
        base = _field_path(loc)
        path: tuple[str | int, ...] = (*loc, *raised.field.split("."))
        candidates = [_field_path(path)] + [(*base, *r.split(".")) for r in raised.related]
        message = raised.message
    else:
        path = loc
        candidates = [_field_path(loc)]
        if isinstance(raised, ValueError):
            message = str(raised)
        elif error["type"] == "extra_forbidden":
            name = str(loc[-1])
            message = unknown_field_message(name, _field_path(loc[:-1]))
        elif error["type"] == "missing" and loc and isinstance(loc[-1], int):
            # A tuple one value short: name the tuple, not its absent item.
            path = loc[:-1]
            message = f"{_short(error['input'])} has too few values"
        else:
            message = f"{error['msg']} (got {_short(error['input'])})"
    line = next((lines[c] for c in candidates if c in lines), None)
    return SpecError(message, source=source, line=line, field=render_path(path))


def spec_from_data(
    data: Any, *, source: str, lines: Mapping[FieldPath, int] | None = None
) -> ExperimentSpec:
    """Validate ``data`` (a JSON-like mapping) into a spec.

    ``lines`` maps field paths to the 1-based line where the text form sets them. When
    several checks fail, the error reported is the first one in the file.
    """
    if not isinstance(data, Mapping):
        raise SpecError(
            f"a spec must be an object of fields, got {type(data).__name__}", source=source
        )
    try:
        return ExperimentSpec.model_validate(dict(data))
    except ValidationError as exc:
        errors = [_describe(e, source=source, lines=lines or {}) for e in exc.errors()]
    first = min(errors, key=lambda e: (e.line is None, e.line or 0))
    raise first


def spec_from_json(obj: Any, *, source: str = "<json>") -> ExperimentSpec:
    """The spec in its JSON form (the REST API's): a mapping like ``spec.model_dump(mode=
    "json")``, where list-valued fields may also be TAO strings (``"(832, 1344)"``).

    Raises :class:`SpecError` naming the JSON field path (no line).
    """
    return spec_from_data(obj, source=source)
