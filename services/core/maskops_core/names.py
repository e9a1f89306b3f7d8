"""The rule for names a client gives (datasets, experiments, tokens): printable text.

A name is shown in listings, the dashboard, logs and terminals. Control characters were
stored as they came (a NUL byte); bidirectional controls reorder what a reader sees
(U+202E shows ``exe.txt`` for ``txt.exe``), and invisible characters (U+200B, U+FEFF)
make two names that look the same differ. Refused: Unicode categories Cc (controls), Cf
(format characters: bidi controls, zero-width characters, the byte order mark), Cs (lone
surrogates), Zl and Zp (line and paragraph separators).
"""

from __future__ import annotations

import unicodedata

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def name_problem(value: str) -> str:
    """``""``, or why ``value`` is no name (naming the first character refused, and where)."""
    for index, char in enumerate(value):
        if unicodedata.category(char) in REFUSED_CATEGORIES:
            what = unicodedata.name(char, "a control character")
            return (
                "must not contain control characters, bidirectional controls or invisible "
                f"characters (U+{ord(char):04X} {what} at position {index})"
            )
    return ""


def check_name(value: str) -> str:
    """``value``, or ValueError saying which character it must not contain."""
    if problem := name_problem(value):
        raise ValueError(problem)
    return value
