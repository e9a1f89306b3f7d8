"""TAO's string-valued lists: decode ``"(832, 1344)"``-style values and write them back.

TAO keeps list-valued spec fields as strings in its protobuf schema (``image_size:
"(832, 1344)"``, ``aspect_ratios: "[(1.0, 1.0), (1.4, 0.7)]"``) and evaluates them as Python
literals. maskops does the same with :func:`ast.literal_eval` (literals only, never code) and
then checks the shape, so a malformed value is reported as a one-line error for its field.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from typing import Any


def decode_literal(text: str) -> Any:
    """The Python literal a TAO list string holds; ``""`` is an empty list.

    Raises ValueError (with the offending text) when it is not a literal.
    """
    stripped = text.strip()
    if not stripped:
        return []
    try:
        return ast.literal_eval(stripped)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError(f"cannot read {text!r} as a list or tuple of numbers") from None


def _number(value: float) -> str:
    """Shortest text that reads back as exactly ``value`` (ints stay ints)."""
    if isinstance(value, bool):
        raise TypeError("booleans are not numbers here")
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise ValueError(f"{value} is not finite")
    return repr(float(value))


def format_tuple(values: Sequence[float]) -> str:
    """``(832, 1344)`` / ``(10.0, 10.0, 5.0, 5.0)``: TAO's tuple form."""
    return "(" + ", ".join(_number(v) for v in values) + ")"


def format_list(values: Sequence[float]) -> str:
    """``[60000, 80000]`` / ``[0.1, 0.02]``: TAO's list form."""
    return "[" + ", ".join(_number(v) for v in values) + "]"


def format_tuple_list(values: Sequence[Sequence[float]]) -> str:
    """``[(1.0, 1.0), (1.4, 0.7)]``: TAO's list-of-pairs form."""
    return "[" + ", ".join(format_tuple(v) for v in values) + "]"
