"""What the options tests of every task share: a task's command line as a builder of its
engine options object, and the values inside ``Literal`` types (tests/unit/test_task_options.py
checks each task's flags against its object; each task's own test file checks the REST
options model)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from maskops.cli.main import build_parser


@dataclass(frozen=True)
class TaskCli:
    """A ``maskops`` task's flags and the engine options object they build."""

    base: list[str]
    """The task's command with its required arguments and no option."""
    build: Callable[[argparse.Namespace], Any]
    defaults: Any
    cli_flag: Callable[[str], str]
    other_values: dict[str, Any]
    """A value other than the default for every option."""

    def options(self, *flags: str) -> Any:
        return self.build(build_parser().parse_args([*self.base, *flags]))

    def flags(self, name: str, value: Any) -> list[str]:
        """The flags that set option ``name`` to ``value``."""
        flag = self.cli_flag(name)
        if value is True:
            return [flag]
        if value is False:  # an option on by default: --no-<flag> turns it off
            return [flag.replace("--", "--no-", 1)]
        return [flag, ",".join(value) if isinstance(value, tuple) else str(value)]


def literals(annotation: Any) -> set[object]:
    """The values of the Literal types inside ``annotation`` (``X | None`` included)."""
    args = get_args(annotation)
    if not args:
        return set()
    if all(not get_args(a) and not isinstance(a, type) for a in args):
        return set(args)
    return set().union(*(literals(a) for a in args))
