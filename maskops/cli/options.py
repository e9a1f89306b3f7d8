"""A subcommand's option flags, built from its task's declaration
(:mod:`maskops.options_schema`): each declared option with a flag becomes an argparse
argument whose ``dest`` is the option's name, with the declared spellings, default, choices
and help (a required option: a required flag), in its declared argument group if it has
one; :func:`options_from_args` reads them back into the options dataclass."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from maskops.options_schema import DeclaredOption, declared_options

OptionsT = TypeVar("OptionsT")


def add_option_flags(
    parser: argparse.ArgumentParser,
    options_class: type,
    *,
    types: Mapping[str, Callable[[str], Any]] | None = None,
    group_descriptions: Mapping[str, str] | None = None,
    keywords: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """The flags of ``options_class``'s declared options; ``types`` parses an option's
    text where the command line checks it itself (with a message of its own);
    ``group_descriptions`` describes the declared argument groups (by title) in the help;
    ``keywords`` adds or replaces argparse keywords of an option's flag where the command
    line reads it differently (TAO's ``--gpu_index I [J ...]``: ``nargs``), which
    its command then turns into the option's value before :func:`options_from_args`."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for declared in declared_options(options_class):
        if declared.flags:
            argument = _argument(declared)
            if types and declared.name in types:
                argument["type"] = types[declared.name]
            if keywords and declared.name in keywords:
                argument |= keywords[declared.name]
            title = declared.spec.group
            if title is not None and title not in groups:
                description = (group_descriptions or {}).get(title)
                groups[title] = parser.add_argument_group(title, description)
            target = parser if title is None else groups[title]
            target.add_argument(*declared.flags, **argument)


def _argument(declared: DeclaredOption) -> dict[str, Any]:
    """argparse's keywords for one option."""
    keywords: dict[str, Any] = {"dest": declared.name, "help": _argparse_help(declared.spec.help)}
    default = declared.cli_default
    kind = declared.base_type
    if declared.required:
        keywords |= {"required": True, "type": kind if kind in (int, float, Path) else str}
    elif kind is bool:
        action = argparse.BooleanOptionalAction if default else "store_true"
        keywords |= {"action": action, "default": default}
    else:
        keywords["default"] = list(default) if isinstance(default, tuple) else default
        if declared.choices:
            keywords["choices"] = declared.choices
        else:
            keywords["type"] = kind if kind in (int, float, Path) else str
    return keywords | dict(declared.spec.cli)


_LITERAL_PERCENT = re.compile(r"%(?!\()")
"""A ``%`` that is not argparse's ``%(name)s``: a declared help text is plain text (the REST
door shows it as written), which argparse would read as a format directive."""


def _argparse_help(text: str) -> str:
    """A declared help text as argparse expects it: literal ``%`` doubled, ``%(default)s``
    kept."""
    return _LITERAL_PERCENT.sub("%%", text)


def options_from_args(args: argparse.Namespace, options_class: type[OptionsT]) -> OptionsT:
    """The options dataclass the parsed flags ask for: each option with a flag from its
    argument (lists as tuples; an option whose flag was left unset, where its flag's default
    is None, keeps the engine's default)."""
    values: dict[str, Any] = {}
    for declared in declared_options(options_class):
        if not declared.flags:
            continue
        value = getattr(args, declared.name)
        if value is None and declared.cli_default is None and declared.default is not None:
            continue
        values[declared.name] = tuple(value) if isinstance(value, list) else value
    return options_class(**values)


def flag_of(options_class: type, name: str) -> str:
    """The flag messages name for option ``name``."""
    return next(o.flag for o in declared_options(options_class) if o.name == name)
