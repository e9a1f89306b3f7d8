"""The dataset_convert options reach the converters only through the engine's object
(:class:`ConvertOptions`, declared once: tests/unit/test_task_declarations.py checks its
flags and the REST dataset's fields), and ``--labels`` is split at commas."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

import pytest

from maskops.cli import dataset_convert as cli_convert
from maskops.cli.main import build_parser
from maskops.data.convert import convert_dataset
from maskops.data.convert_options import DEFAULTS, ConvertOptions
from maskops.data.formats import convert_labelled_dataset

BASE = ["dataset_convert", "-i", "images", "-a", "train.json", "-o", "out"]


def _options(*flags: str) -> ConvertOptions:
    return cli_convert.convert_options(build_parser().parse_args([*BASE, *flags]))


def test_the_flags_build_the_engine_s_options() -> None:
    assert _options() == DEFAULTS
    given = _options(
        "--format", "via", "--labels", "cat, dog", "-t", "train", "-s", "4",
        "--no-include_mask", "--workers", "2", "--drop_empty_images",
    )  # fmt: skip
    assert given == ConvertOptions(
        format_name="via",
        labels=("cat", "dog"),
        tag="train",
        num_shards=4,
        include_masks=False,
        workers=2,
        drop_empty_images=True,
    )
    assert (
        _options("--include_masks").include_masks
        and not _options("--no-include_masks").include_masks
    )


@pytest.mark.parametrize("function", [convert_dataset, convert_labelled_dataset])
def test_the_converters_take_options_only_through_the_engine_object(function: Any) -> None:
    parameters = set(inspect.signature(function).parameters)
    assert "options" in parameters
    assert not parameters & {f.name for f in fields(ConvertOptions)}
