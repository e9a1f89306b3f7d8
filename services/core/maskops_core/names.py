"""The rule for names a client gives (datasets, experiments, tokens): printable text.

A name is shown in listings, the dashboard, logs and terminals. Control characters were
stored as they came (a NUL byte); bidirectional controls reorder what a reader sees
(U+202E shows ``exe.txt`` for ``txt.exe``), and invisible characters (U+200B, U+FEFF)
make two names that look the same differ. Refused: Unicode categories Cc (controls), Cf
(format characters: bidi controls, zero-width characters, the byte order mark), Cs (lone
surrogates), Zl and Zp (line and paragraph separators), in the Basic Multilingual Plane.
"""

from __future__ import annotations

import re
import unicodedata

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
REFUSED_RANGES: tuple[tuple[int, int], ...] = (
    (0x00, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD),
    (0x70F, 0x70F), (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F),
    (0x2028, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0xD800, 0xDFFF), (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
)  # fmt: skip
"""Every code point of :data:`REFUSED_CATEGORIES` in the Basic Multilingual Plane (Unicode
15), first and last of each run: one list for the check and for the OpenAPI schema's
pattern (:data:`NAME_PATTERN`). The few format characters beyond it (tag characters,
hieroglyph and musical-notation controls) are left out: JSON Schema's pattern dialects
and the request generators that read them name only ``\\uXXXX``."""
SURROGATES = (0xD800, 0xDFFF)


def _character_class(escape: str, *, surrogates: bool) -> str:
    """The refused ranges as a character class body, each code point written by ``escape``
    (a format taking it); ``surrogates=False`` for the schema, whose validators read text
    as Unicode scalar values (a client's JSON carries no lone surrogate a pattern sees)."""
    ranges = [r for r in REFUSED_RANGES if surrogates or r != SURROGATES]
    return "".join(
        escape.format(a) if a == b else f"{escape.format(a)}-{escape.format(b)}" for a, b in ranges
    )


NAME_PATTERN = "^[^" + _character_class(r"\u{:04x}", surrogates=False) + "]*$"
"""The schema's pattern, in the ``\\uXXXX`` escapes that ECMA-262 and Python share."""
_REFUSED = re.compile("[" + _character_class(r"\u{:04x}", surrogates=True) + "]")


def name_problem(value: str) -> str:
    """``""``, or why ``value`` is no name (naming the first character refused, and where)."""
    found = _REFUSED.search(value)
    if found is None:
        return ""
    char = found.group()
    what = unicodedata.name(char, "a control character")
    return (
        "must not contain control characters, bidirectional controls or invisible "
        f"characters (U+{ord(char):04X} {what} at position {found.start()})"
    )


def check_name(value: str) -> str:
    """``value``, or ValueError saying which character it must not contain."""
    if problem := name_problem(value):
        raise ValueError(problem)
    return value
