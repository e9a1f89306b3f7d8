"""Every task is declared once (:mod:`maskops.tasks`): each declared option is a flag of
its ``maskops`` subcommand with the declared spellings, default (or required), choices and
argument group, and a field of its REST model (its job action's options; dataset_convert's:
the REST dataset's) with the declared default (or required), bounds, pattern, help and
other names; the catalogue's action and the worker's function are the task's (a task that
is no job action has no REST options)."""

from __future__ import annotations

import argparse
import importlib

import pytest
from pydantic import BaseModel, ValidationError

from maskops.cli.main import build_parser
from maskops.options_schema import DeclaredOption, declared_options
from maskops.tasks import TASKS
from maskops_api.schemas import DatasetCreate
from maskops_core.actions import JobAction
from maskops_core.options import ActionOptions
from maskops_worker.actions import ACTIONS


def _subcommand(name: str) -> argparse.ArgumentParser:
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    parser: argparse.ArgumentParser = subparsers.choices[name]
    return parser


REST_BODIES: dict[str, type[BaseModel]] = {"dataset_convert": DatasetCreate}
"""Tasks whose REST options are not a job's: a dataset's conversion is asked for by
registering the dataset."""


def _rest_model(task: str) -> type[BaseModel] | None:
    if not TASKS[task].job_action:
        return None
    return REST_BODIES.get(task) or JobAction.named(task).spec.options


def _group_of(parser: argparse.ArgumentParser, dest: str) -> str | None:
    """The title of the argument group listing ``dest`` (None: the parser's own lists)."""
    own = {parser._positionals.title, parser._optionals.title}
    for group in parser._action_groups:
        if group.title not in own and any(a.dest == dest for a in group._group_actions):
            return group.title
    return None


OPTIONS = [(task, o) for task in sorted(TASKS) for o in declared_options(TASKS[task].options)]
IDS = [f"{task}.{o.name}" for task, o in OPTIONS]


@pytest.mark.parametrize(("task", "declared"), OPTIONS, ids=IDS)
def test_a_declared_option_is_its_subcommand_s_flag(task: str, declared: DeclaredOption) -> None:
    parser = _subcommand(task)
    arguments = {a.dest: a for a in parser._actions}
    if not declared.flags:
        assert declared.name not in arguments or not arguments[declared.name].option_strings
        return
    argument = arguments[declared.name]
    # A flag on by default has a --no- spelling after each of its own.
    spellings = [s for s in argument.option_strings if not s.startswith("--no-")]
    assert tuple(spellings[: len(declared.flags)]) == declared.flags
    assert _group_of(parser, declared.name) == declared.spec.group
    assert argument.required == declared.required
    default = declared.cli_default
    if declared.required:
        assert argument.default is None
    else:
        assert argument.default == (list(default) if isinstance(default, tuple) else default)
    # A command line may leave a value's check to the engine (its message names the choices).
    checked_here = "choices" not in declared.spec.cli
    assert tuple(argument.choices or ()) == (declared.choices if checked_here else ())
    # argparse reads "%" as a format directive: the flag's help doubles a literal one.
    assert (argument.help or "").replace("%%", "%") == declared.spec.help


@pytest.mark.parametrize(("task", "declared"), OPTIONS, ids=IDS)
def test_a_declared_rest_option_is_its_job_s_field(task: str, declared: DeclaredOption) -> None:
    model = _rest_model(task)
    if model is None or declared.rest_name is None:
        assert model is None or declared.name not in model.model_fields
        return
    schema = model.model_json_schema()
    properties = schema["properties"][declared.rest_name]
    field = model.model_fields[declared.rest_name]
    assert field.is_required() == declared.required
    assert (declared.rest_name in schema.get("required", [])) == declared.required
    if not declared.required:
        assert field.get_default(call_default_factory=True) == (
            list(declared.rest_default)
            if isinstance(declared.rest_default, tuple)
            else declared.rest_default
        )
    assert properties["description"] == declared.spec.help
    if declared.required:  # a job without it is refused naming it
        with pytest.raises(ValidationError, match=declared.rest_name):
            model.model_validate({})
    for alias in declared.spec.rest_aliases:  # TAO API's names set it too
        value = declared.rest_default
        assert getattr(model.model_validate({alias: value}), declared.rest_name) == value
    options = properties.get("anyOf", [properties])
    bounded = next((s for s in options if s.get("type") != "null"), properties)
    assert bounded.get("minimum") == declared.spec.ge
    assert bounded.get("maximum") == declared.spec.le
    if declared.spec.pattern is not None:
        assert bounded["pattern"] == declared.spec.pattern
    if declared.choices:
        items = bounded.get("items", bounded)
        assert tuple(items["enum"]) == declared.choices


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_catalogue_and_the_worker_run_the_declared_task(task: str) -> None:
    module, _, function = TASKS[task].entry.rpartition(".")
    assert callable(getattr(importlib.import_module(module), function))
    if not TASKS[task].job_action:
        assert task not in JobAction.__members__ and task not in ACTIONS
        return
    action = JobAction.named(task)
    if task in REST_BODIES:
        assert action.spec.options.model_fields == {}
    else:
        assert action.spec.options.__name__ == TASKS[task].options.__name__
        assert issubclass(action.spec.options, ActionOptions)
    assert ACTIONS[task].__module__.startswith("maskops_worker.actions")
