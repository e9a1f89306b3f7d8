"""The name rule: one list of refused characters, which the check and the OpenAPI pattern
share, covering every control, format (bidi, zero-width), surrogate and separator code
point of the Basic Multilingual Plane that this Python's Unicode database knows."""

from __future__ import annotations

import unicodedata

from maskops_core.names import NAME_PATTERN, REFUSED_CATEGORIES, name_problem


def test_every_refused_category_is_in_the_list() -> None:
    missing = [
        f"U+{code:04X}"
        for code in range(0x10000)  # the Basic Multilingual Plane
        if unicodedata.category(chr(code)) in REFUSED_CATEGORIES and not name_problem(chr(code))
    ]
    assert not missing


def test_the_schema_pattern_and_the_check_agree() -> None:
    """The pattern as JSON Schema validators read it (ECMA-262; jsonschema-rs, which
    generates the schemathesis test's requests)."""
    import jsonschema_rs

    schema = jsonschema_rs.validator_for({"type": "string", "pattern": NAME_PATTERN})
    names = (
        "shapes",
        "ÃêËW𫊣al",
        "a\u202ecod.exe",
        "x\u200b",
        "\ufeffname",
        "a\x9db",
        "\U000e0041",
    )
    for name in names:
        assert schema.is_valid(name) == (name_problem(name) == ""), name
    assert "U+202E RIGHT-TO-LEFT OVERRIDE at position 1" in name_problem("a\u202ecod.exe")
