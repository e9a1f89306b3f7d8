"""Read a spec file: TAO text, or JSON when the name ends in ``.json``."""

from __future__ import annotations

import json
from pathlib import Path

from maskops.spec.errors import SpecError
from maskops.spec.models import ExperimentSpec
from maskops.spec.text import parse_spec_text
from maskops.spec.validation import spec_from_json


def load_spec(path: str | Path) -> ExperimentSpec:
    """Parse and validate the spec file at ``path`` (paths inside it are not resolved: call
    ``.resolve_paths(Path(path).parent)`` for that). Raises :class:`SpecError`, whose source
    is ``path`` as given."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # Windows editors add a BOM
    except FileNotFoundError:
        raise SpecError("no such file", source=source) from None
    except IsADirectoryError:
        raise SpecError("is a directory, not a spec file", source=source) from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"not UTF-8 text ({exc.reason} at byte {exc.start})", source=source
        ) from None
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror}", source=source) from None
    if Path(path).suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"invalid JSON: {exc.msg}", source=source, line=exc.lineno) from None
        return spec_from_json(data, source=source)
    return parse_spec_text(text, source=source)
