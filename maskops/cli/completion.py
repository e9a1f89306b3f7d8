"""``maskops completion bash|zsh``: a shell completion script, generated from the parser.

Install it with ``maskops completion bash > ~/.local/share/bash-completion/completions/maskops``
(or ``eval "$(maskops completion bash)"`` in ``~/.bashrc``; zsh: ``eval "$(maskops
completion zsh)"`` in ``~/.zshrc``). It completes commands, their actions (``spec check``),
option names and the values of options with a fixed set of choices; anything else
completes as a file name. The script is a table of the parser's words, so it needs no
Python at completion time and stays in step with the installed commands.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from typing import Any

from maskops.cli.common import EXIT_OK

SHELLS = ("bash", "zsh")
ROOT = "maskops"

_FUNCTION = r"""
_maskops() {
    [[ -n "${ZSH_VERSION-}" ]] && setopt local_options ksh_arrays
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" path="maskops" word i
    (( COMP_CWORD > 0 )) && prev="${COMP_WORDS[COMP_CWORD-1]}"
    for (( i = 1; i < COMP_CWORD; i++ )); do
        word="${COMP_WORDS[i]}"
        if [[ "$word" != -* && " ${_maskops_children[$path]-} " == *" $word "* \
              && -n "${_maskops_options[$path $word]-}" ]]; then
            path="$path $word"
        fi
    done
    local choices="${_maskops_choices[$path $prev]-}"
    if [[ -n "$choices" ]]; then
        COMPREPLY=( $(compgen -W "$choices" -- "$cur") )
    elif [[ "$cur" == -* ]]; then
        COMPREPLY=( $(compgen -W "${_maskops_options[$path]-}" -- "$cur") )
    elif [[ -n "${_maskops_children[$path]-}" && "$prev" != -* ]]; then
        COMPREPLY=( $(compgen -W "${_maskops_children[$path]}" -- "$cur") )
    else
        COMPREPLY=( $(compgen -f -- "$cur") )
    fi
}
"""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument("shell", choices=SHELLS, help="the shell that will read the script")
    parser.set_defaults(handler=run)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's commands by name (aliases included); empty when it has none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for name, child in _subparsers(parser).items():
        yield from _walk(child, f"{path} {name}")


def completion_tables(parser: argparse.ArgumentParser) -> dict[str, dict[str, str]]:
    """``{"children"|"options"|"choices": {key: space-separated words}}``: keys are the
    command path (``maskops spec``), for choices followed by the option (``maskops
    dataset_convert --format``). Hidden options (help suppressed) are left out."""
    tables: dict[str, dict[str, str]] = {"children": {}, "options": {}, "choices": {}}
    for path, command in _walk(parser, ROOT):
        children = sorted(_subparsers(command))
        if children:
            tables["children"][path] = " ".join(children)
        options: list[str] = []
        for action in command._actions:
            if not action.option_strings and action.choices is not None and not children:
                tables["children"][path] = " ".join(str(choice) for choice in action.choices)
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            options.extend(action.option_strings)
            if action.choices is not None and action.nargs != 0:
                words = " ".join(str(choice) for choice in action.choices)
                for flag in action.option_strings:
                    tables["choices"][f"{path} {flag}"] = words
        tables["options"][path] = " ".join(sorted(options))
    return tables


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The script for ``shell`` (one of :data:`SHELLS`): the tables as associative arrays,
    the completion function, and its registration for ``maskops``."""
    lines = [f"# {shell} completion for maskops (maskops completion {shell})"]
    if shell == "zsh":
        lines.append("autoload -U +X bashcompinit && bashcompinit")
    for table, entries in completion_tables(parser).items():
        name = f"_maskops_{table}"
        lines.append(f"unset {name}; typeset -gA {name}")
        lines.extend(f"{name}[{shlex.quote(k)}]={shlex.quote(v)}" for k, v in entries.items())
    lines.append(_FUNCTION.strip())
    lines.append("complete -o default -F _maskops maskops")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from maskops.cli.main import build_parser

    print(completion_script(build_parser(), args.shell), end="")
    return EXIT_OK
