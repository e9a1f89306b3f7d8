"""The format check at the door reads a bounded prefix of an annotation file: memory and
time do not grow with the file, and no nesting depth overflows the recursion limit."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from maskops_core.dataset_formats import SNIFF_BYTES, format_problem

DEEP = 200_000
"""Nesting levels: far beyond the interpreter's recursion limit."""


def _peak_bytes(format_name: str, path: Path) -> tuple[str | None, int]:
    tracemalloc.start()
    try:
        problem = format_problem(format_name, path)
        return problem, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("format_name", ["via", "labelstudio"])
def test_a_large_file_is_checked_from_a_prefix(format_name: str, tmp_path: Path) -> None:
    regions = [{"shape_attributes": {"name": "rect", "x": 1, "y": 1, "width": 4, "height": 4}}]
    if format_name == "via":
        document: object = {
            f"{k}.png": {"filename": f"{k}.png", "regions": regions} for k in range(40_000)
        }
    else:
        document = [{"data": {"image": f"{k}.png"}, "annotations": []} for k in range(60_000)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(document))
    assert path.stat().st_size > 2_500_000
    problem, peak = _peak_bytes(format_name, path)
    assert problem is None
    assert peak < 4 * SNIFF_BYTES, peak  # parsing it whole held tens of megabytes


@pytest.mark.parametrize(
    ("format_name", "text", "looks_right"),
    [
        ("labelstudio", "[" * DEEP + "]" * DEEP, False),
        ("labelstudio", '[{"data": ' + "[" * DEEP + "]" * DEEP + "}]", True),
        ("via", '{"a": ' * DEEP + "1" + "}" * DEEP, False),
        ("labelme", '{"shapes": ' + "[" * DEEP + "]" * DEEP + "}", True),
    ],
)
def test_deeply_nested_json_is_judged_without_recursion(
    format_name: str, text: str, looks_right: bool, tmp_path: Path
) -> None:
    path = tmp_path / "deep.json"
    path.write_text(text)
    problem = format_problem(format_name, path)
    assert (problem is None) == looks_right, problem


@pytest.mark.parametrize(
    ("format_name", "document"),
    [
        ("labelstudio", {"a.png-1": {"filename": "a.png", "regions": []}}),
        ("labelstudio", []),
        ("via", [{"data": {"image": "a.png"}, "annotations": []}]),
        ("via", {"images": [], "annotations": [], "categories": []}),
        ("labelme", {"images": []}),
    ],
)
def test_another_format_is_named(format_name: str, document: object, tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps(document))
    problem = format_problem(format_name, path)
    assert problem is not None and problem.startswith("expected ")
