"""Every task's ``maskops`` flags build its engine options object: with no option they give
the engine's defaults, and each flag sets its option alone (each task's own test file
checks its REST options model against the same object)."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from tests.support.options_agreement import TaskCli
from tests.unit.data.test_convert_options import CLI as CONVERT

TASKS = {
    "dataset_convert": CONVERT,
}
OPTIONS = [(task, name) for task, cli in TASKS.items() for name in sorted(cli.other_values)]


@pytest.mark.parametrize("task", sorted(TASKS))
def test_other_values_cover_every_option(task: str) -> None:
    cli: TaskCli = TASKS[task]
    assert set(cli.other_values) == {f.name for f in fields(cli.defaults)}
    assert all(getattr(cli.defaults, k) != v for k, v in cli.other_values.items())


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_cli_defaults_are_the_engine_defaults(task: str) -> None:
    assert TASKS[task].options() == TASKS[task].defaults


@pytest.mark.parametrize(("task", "name"), OPTIONS)
def test_each_option_has_its_cli_flag(task: str, name: str) -> None:
    cli = TASKS[task]
    value = cli.other_values[name]
    assert cli.options(*cli.flags(name, value)) == replace(cli.defaults, **{name: value})
