"""One definition of the dataset_convert options: the engine's ConvertOptions and the
``maskops dataset_convert`` flags agree on names, choices and defaults, the REST dataset's
conversion fields are the engine's, and convert_dataset and convert_labelled_dataset take
the options only through the engine's object."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any, get_args

import pytest

from maskops.cli import dataset_convert as cli_convert
from maskops.cli.main import build_parser
from maskops.data.convert import convert_dataset
from maskops.data.convert_options import (
    DEFAULTS,
    FORMAT_NAMES,
    ConvertOptions,
    cli_flag,
)
from maskops.data.formats import convert_labelled_dataset
from maskops_api.schemas import DatasetCreate
from tests.support.options_agreement import TaskCli

BASE = ["dataset_convert", "-i", "images", "-a", "train.json", "-o", "out"]
OTHER_VALUES: dict[str, Any] = {
    "format_name": "via",
    "labels": ("cat", "dog"),
    "tag": "train",
    "num_shards": 4,
    "include_masks": False,
    "workers": 2,
    "drop_empty_images": True,
}
"""A value other than the default for every option."""
CLI = TaskCli(BASE, cli_convert.convert_options, DEFAULTS, cli_flag, OTHER_VALUES)


def test_the_format_flag_offers_the_engine_s_formats() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*BASE, cli_flag("format_name"), "not-a-format"])
    assert {CLI.options(cli_flag("format_name"), f).format_name for f in FORMAT_NAMES} == set(
        FORMAT_NAMES
    )


def test_the_rest_dataset_s_conversion_fields_are_the_engine_s() -> None:
    rest = DatasetCreate.model_fields
    assert rest["include_masks"].default == DEFAULTS.include_masks
    assert rest["format"].default == DEFAULTS.format_name
    assert set(get_args(rest["format"].annotation)) == set(FORMAT_NAMES)
    # Its own default (it registers small datasets): fewer shards than the engine's.
    assert "num_shards" in rest


@pytest.mark.parametrize("function", [convert_dataset, convert_labelled_dataset])
def test_the_converters_take_options_only_through_the_engine_object(function: Any) -> None:
    parameters = set(inspect.signature(function).parameters)
    assert "options" in parameters
    assert not parameters & {f.name for f in fields(ConvertOptions)}
