"""Spec conversions for the API: JSON or TAO text in, ``ExperimentSpec`` out, text back.

Both directions are the spec engineer's functions in :mod:`maskops.spec`; this module only
turns every failure into :class:`SpecError`, which the API answers with 422 and its
field/line message.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

import maskops.spec as spec_pkg
from maskops.spec.errors import SpecError
from maskops.spec.models import ExperimentSpec

__all__ = ["SpecError", "spec_from_json", "spec_from_text", "spec_to_text"]


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
