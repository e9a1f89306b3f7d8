"""How a task's options are declared: once, on the task's options dataclass.

Each field of a task's options dataclass (``maskops.export.options.ExportOptions``, ...) is
made with :func:`option`, which records in the field's metadata what the command line and
the REST door need: the help text, TAO's flag spelling(s), the REST field name (or none:
the option is the command line's only), bounds, and the few places where a door's default
differs from the engine's. From it :mod:`maskops.cli.options` builds each subcommand's
flags, ``maskops_core.options`` builds each job action's pydantic options model, and the
worker turns a job's options back into the dataclass (:func:`engine_values`). Adding an
option is one :func:`option` field; an option whose default is ``dataclasses.MISSING`` is
required at both doors (a required flag, a required REST field). Standard library only:
the control-plane core imports it without the engine's libraries.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

_SAME: Any = object()
"""A door's default that is the engine's."""
_METADATA_KEY = "maskops_option"

MAX_GPU_INDEX = 63
"""The highest CUDA device a job may name (every task's ``gpu_index``)."""
GPU_INDEX_HELP = "the CUDA device to use when CUDA is available (the CPU otherwise)"


@dataclass(frozen=True)
class OptionSpec:
    """What :func:`option` records about one option."""

    help: str
    flags: tuple[str, ...] | None
    """The command line's spellings; () for ``--<name>``; None: no flag."""
    rest: str | None
    """The REST field name; None: not a job option."""
    ge: float | None = None
    le: float | None = None
    max_items: int | None = None
    """The most items of a list option at the REST door."""
    max_length: int | None = None
    """The longest text option at the REST door (at least one character)."""
    pattern: str | None = None
    """The regular expression a text option matches at the REST door (anchored)."""
    rest_aliases: tuple[str, ...] = ()
    """Other REST names the door accepts for the option (TAO API's)."""
    group: str | None = None
    """The title of the argparse argument group the flag is listed in (None: the
    subcommand's own options)."""
    rest_default: Any = _SAME
    cli_default: Any = _SAME
    cli: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """argparse keywords beyond the type, default and choices (``nargs``, ``action``)."""


def option(
    default: Any,
    *,
    help: str,
    flag: str | tuple[str, ...] | None = (),
    rest: bool | str = False,
    ge: float | None = None,
    le: float | None = None,
    max_items: int | None = None,
    max_length: int | None = None,
    pattern: str | None = None,
    rest_aliases: tuple[str, ...] = (),
    group: str | None = None,
    rest_default: Any = _SAME,
    cli_default: Any = _SAME,
    cli: Mapping[str, Any] | None = None,
) -> Any:
    """A declared option (a dataclass field): ``default`` is the engine's
    (``dataclasses.MISSING``: the option is required, at both doors; such a field comes
    before those with defaults); ``flag`` is its command-line spelling(s) (default
    ``--<name>``; None: none), ``group`` the argparse group listing it, ``rest`` makes it a
    job option (True: under its own name; a string: under that name) and ``rest_aliases``
    other names the REST door accepts for it; ``ge``/``le`` bound numbers at the REST door,
    ``max_items`` bounds a list there, ``max_length`` a text and ``pattern`` (a regular
    expression, anchored) its characters; ``rest_default`` and ``cli_default`` are a door's
    default where it is not the engine's."""
    flags = (flag,) if isinstance(flag, str) else flag
    spec = OptionSpec(
        help=help,
        flags=flags,
        rest=(None if rest is False else "" if rest is True else rest),
        ge=ge,
        le=le,
        max_items=max_items,
        max_length=max_length,
        pattern=pattern,
        rest_aliases=rest_aliases,
        group=group,
        rest_default=rest_default,
        cli_default=cli_default,
        cli=dict(cli or {}),
    )
    return dataclasses.field(default=default, metadata={_METADATA_KEY: spec})


@dataclass(frozen=True)
class DeclaredOption:
    """One option of a task, as the doors read it."""

    name: str
    """The dataclass field (the engine's name)."""
    annotation: Any
    """The field's type, resolved (``Literal[...]``, ``int | None``, ``tuple[str, ...]``)."""
    default: Any
    """The engine's default; ``dataclasses.MISSING`` for a required option."""
    spec: OptionSpec

    @property
    def required(self) -> bool:
        """No default: the command line and the REST door both require the option."""
        return self.default is dataclasses.MISSING

    @property
    def flags(self) -> tuple[str, ...]:
        """The command line's spellings (none: not on the command line)."""
        if self.spec.flags is None:
            return ()
        return self.spec.flags or (f"--{self.name}",)

    @property
    def flag(self) -> str:
        """The spelling messages name: the first."""
        return self.flags[0]

    @property
    def rest_name(self) -> str | None:
        """The REST field name, or None."""
        if self.spec.rest is None:
            return None
        return self.spec.rest or self.name

    @property
    def cli_default(self) -> Any:
        return self.default if self.spec.cli_default is _SAME else self.spec.cli_default

    @property
    def rest_default(self) -> Any:
        return self.default if self.spec.rest_default is _SAME else self.spec.rest_default

    @property
    def choices(self) -> tuple[Any, ...]:
        """The values of the ``Literal`` inside the type (``X | None`` and ``tuple[X, ...]``
        included), else ()."""
        return literal_values(self.annotation)

    @property
    def base_type(self) -> Any:
        """The type without ``| None`` and, for ``tuple[X, ...]``, X."""
        kind = without_none(self.annotation)
        if get_origin(kind) is tuple:
            return without_none(get_args(kind)[0])
        return kind

    @property
    def is_list(self) -> bool:
        return get_origin(without_none(self.annotation)) is tuple


def without_none(annotation: Any) -> Any:
    """``X`` of ``X | None`` (``annotation`` itself otherwise)."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def literal_values(annotation: Any) -> tuple[Any, ...]:
    """The values of the ``Literal`` inside ``annotation`` (see :attr:`DeclaredOption.choices`)."""
    kind = without_none(annotation)
    if get_origin(kind) is tuple:
        kind = without_none(get_args(kind)[0])
    return get_args(kind) if get_origin(kind) is Literal else ()


def declared_options(options_class: type) -> tuple[DeclaredOption, ...]:
    """The declared options of a task's options dataclass, in field order."""
    hints = typing.get_type_hints(options_class)
    return tuple(
        DeclaredOption(field.name, hints[field.name], field.default, field.metadata[_METADATA_KEY])
        for field in dataclasses.fields(options_class)
        if _METADATA_KEY in field.metadata
    )


def declared(options_class: type, name: str) -> DeclaredOption:
    """Option ``name`` of ``options_class``."""
    return next(o for o in declared_options(options_class) if o.name == name)


def engine_values(options_class: type, rest_values: Mapping[str, Any]) -> dict[str, Any]:
    """The dataclass fields of a job's REST options (``rest_values``: those the job set, by
    REST name); lists become the tuples the dataclass holds. Options the job did not set
    keep the engine's defaults."""
    values: dict[str, Any] = {}
    for declared_option in declared_options(options_class):
        name = declared_option.rest_name
        if name is not None and name in rest_values:
            value = rest_values[name]
            values[declared_option.name] = tuple(value) if isinstance(value, list) else value
    return values


@dataclass(frozen=True)
class TaskDeclaration:
    """One task: its ``maskops`` subcommand and job action ``name``, its options dataclass
    (each field an :func:`option`), and its entry function by dotted name (importing it
    would load torch)."""

    name: str
    options: type
    entry: str
    summary: str
    """What the task does, in one line (the subcommand's help)."""
    takes_model: bool = False
    """It works on a model file: a job names it through its parent or ``model_path``."""
    job_action: bool = True
    """It is a job action too (the REST door); False: the command line's only."""
