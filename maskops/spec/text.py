"""The text form of a spec: protobuf text format exactly as TAO writes it.

Parsing uses the real schema (``experiment.proto``) and ``google.protobuf.text_format``, so a
spec written for ``tao mask_rcnn`` parses unchanged, ``#`` comments included. Syntax errors
and unknown fields become :class:`SpecError` with the line and, for a misspelt field, the
closest valid name; validation errors found afterwards are placed on the line where the field
is written (recent protobuf releases no longer record parse locations, so a light token
scan finds them).

Regenerate ``experiment_pb2.py`` / ``.pyi`` after editing ``experiment.proto``::

    .venv/bin/python -m grpc_tools.protoc -I. \\
        --python_out=. --pyi_out=. maskops/spec/experiment.proto
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from maskops.spec import experiment_pb2
from maskops.spec.errors import SpecError
from maskops.spec.literals import format_list, format_tuple, format_tuple_list
from maskops.spec.models import ExperimentSpec
from maskops.spec.validation import FieldPath, spec_from_data, unknown_field_message

_BLOCK_OF_TYPE: dict[str, FieldPath] = {
    experiment_pb2.Experiment.DESCRIPTOR.full_name: (),
    experiment_pb2.DataConfig.DESCRIPTOR.full_name: ("data_config",),
    experiment_pb2.MaskRCNNConfig.DESCRIPTOR.full_name: ("maskrcnn_config",),
    experiment_pb2.WandBConfig.DESCRIPTOR.full_name: ("wandb_config",),
    experiment_pb2.ClearMLConfig.DESCRIPTOR.full_name: ("clearml_config",),
    experiment_pb2.MLflowConfig.DESCRIPTOR.full_name: ("mlflow_config",),
}

HEADER = "# maskops experiment spec (TAO mask_rcnn format)\n"

_TAO_INTEGER_FIELD = re.compile(r"^(\s*anchor_scale: -?\d+)\.0$", re.MULTILINE)
"""TAO types anchor_scale as an integer and maskops as a real: write integral values as
integers so that TAO can read the text too."""


def parse_spec_text(text: str, *, source: str = "<spec>") -> ExperimentSpec:
    """Parse and validate a TAO ``mask_rcnn`` experiment spec.

    ``source`` names the spec in errors (usually its path). Relative paths in the spec are
    kept as written; see :meth:`ExperimentSpec.resolve_paths`. Raises :class:`SpecError`.
    """
    message = experiment_pb2.Experiment()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise _syntax_error(exc, text, source) from None
    return spec_from_data(_message_to_data(message), source=source, lines=field_lines(text))


def spec_to_text(spec: ExperimentSpec) -> str:
    """The spec as TAO-style text; ``parse_spec_text(spec_to_text(s)) == s``.

    Every TAO field is written (TAO itself would read unset fields as 0, not as maskops'
    defaults) except those its sample specs leave out, which are written when set; maskops
    extension fields only when they differ from their defaults, so that the text stays
    readable by TAO whenever no extension is used.
    """
    message = experiment_pb2.Experiment()
    data = spec.model_dump()
    defaults = ExperimentSpec().model_dump()
    for name in (*ExperimentSpec.OPTIONAL_TAO_FIELDS, *ExperimentSpec.EXTENSION_FIELDS):
        if data[name] == defaults[name]:
            del data[name]
    _fill(message, data)
    text = text_format.MessageToString(message, as_utf8=True)
    return HEADER + _TAO_INTEGER_FIELD.sub(r"\1", text)


# --- text <-> data ------------------------------------------------------------------------


def _message_to_data(message: Message) -> dict[str, Any]:
    """The fields the text sets (every scalar tracks presence), nested blocks as dicts,
    repeated fields as lists, enum values by name."""
    data: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            data[field.name] = _message_to_data(value)
        elif field.enum_type is not None:
            data[field.name] = field.enum_type.values_by_number[value].name
        elif _is_repeated(field):
            data[field.name] = list(value)
        else:
            data[field.name] = value
    return data


def _is_repeated(field: Any) -> bool:
    # protobuf >= 5 has is_repeated; older releases only the label.
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _fill(message: Message, data: Mapping[str, Any]) -> None:
    fields = message.DESCRIPTOR.fields_by_name
    for name, value in data.items():
        field = fields[name]
        if value is None:
            continue  # an absent optional block
        if isinstance(value, Mapping):
            # Set the block even when all its fields are defaults: its presence means "on".
            getattr(message, name).SetInParent()
            _fill(getattr(message, name), value)
        elif field.enum_type is not None:
            setattr(message, name, field.enum_type.values_by_name[value].number)
        elif _is_repeated(field):
            getattr(message, name).extend(value)
        else:
            setattr(message, name, _text_value(value))


def _text_value(value: Any) -> Any:
    """List-valued fields in TAO's string form; scalars unchanged."""
    if isinstance(value, tuple):
        return format_tuple(value)
    if isinstance(value, list):
        if value and isinstance(value[0], tuple | list):
            return format_tuple_list(value)
        return format_list(value)
    return value


# --- locating fields in the text -----------------------------------------------------------


class _Token(NamedTuple):
    kind: str
    text: str
    line: int
    """1-based."""
    column: int
    """1-based."""


_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<comment>\#.*)
      | (?P<string>"(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?)
      | (?P<ident>[A-Za-z_]\w*)
      | (?P<number>[-+]?(?:\d|\.\d)[\w.+-]*)
      | (?P<punct>.)""",
    re.VERBOSE,
)


def _tokens(text: str) -> Iterator[_Token]:
    # Text-format strings cannot span lines, so tokenising line by line is exact.
    for number, line in enumerate(text.split("\n"), start=1):
        for match in _TOKEN.finditer(line):
            kind = match.lastgroup or "punct"
            if kind not in ("space", "comment"):
                yield _Token(kind, match.group(), number, match.start() + 1)


def _field_occurrences(text: str) -> list[tuple[FieldPath, int, int]]:
    """Every field the text writes, in order: (path, line, column). Tolerates bad syntax."""
    tokens = list(_tokens(text))
    found: list[tuple[FieldPath, int, int]] = []
    stack: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.text in ("}", ">"):
            if stack:
                stack.pop()
            continue
        if token.kind != "ident":
            continue
        found.append(((*stack, token.text), token.line, token.column))
        if i < len(tokens) and tokens[i].text == ":":
            i += 1
        if i >= len(tokens):
            break
        value = tokens[i]
        i += 1
        if value.text in ("{", "<"):
            stack.append(token.text)
        elif value.text == "[":
            while i < len(tokens) and tokens[i].text != "]":
                i += 1
            i += 1
        elif value.kind == "string":
            while i < len(tokens) and tokens[i].kind == "string":
                i += 1
        elif value.text == "-":
            i += 1
    return found


def field_lines(text: str) -> dict[FieldPath, int]:
    """The 1-based line where each field of the text is (first) written."""
    lines: dict[FieldPath, int] = {}
    for path, line, _ in _field_occurrences(text):
        lines.setdefault(path, line)
    return lines


def _field_before(text: str, line: int, column: int) -> FieldPath | None:
    previous = None
    for path, at_line, at_column in _field_occurrences(text):
        if (at_line, at_column) > (line, column):
            break
        previous = path
    return previous


# --- syntax errors ---------------------------------------------------------------------------

_LOCATION = re.compile(r"^\d+(?::\d+)? : ")
_NO_FIELD = re.compile(r'^Message type "([\w.]+)" has no field named "([^"]+)"\.?$')
_REPEATED = re.compile(r'^Message type "([\w.]+)" should not have multiple "([^"]+)" fields\.?$')


def _syntax_error(exc: text_format.ParseError, text: str, source: str) -> SpecError:
    line, column = exc.GetLine(), exc.GetColumn()
    message = _LOCATION.sub("", str(exc))
    if match := _NO_FIELD.match(message):
        block = _BLOCK_OF_TYPE.get(match[1], ())
        name = match[2]
        return SpecError(
            unknown_field_message(name, block),
            source=source,
            line=line,
            field=".".join((*block, name)),
        )
    if match := _REPEATED.match(message):
        block = _BLOCK_OF_TYPE.get(match[1], ())
        return SpecError(
            "set more than once", source=source, line=line, field=".".join((*block, match[2]))
        )
    lines = text.split("\n")
    raw_line = lines[line - 1] if line is not None and 0 < line <= len(lines) else None
    # Value errors quote the offending line: "'  seed: x': Couldn't parse integer: x".
    prefix = f"'{raw_line}': " if raw_line is not None else None
    if prefix is not None and message.startswith(prefix):
        path = _field_before(text, line or 0, column or 0)
        detail = message[len(prefix) :]
        if detail.startswith("Expected string but found: '") and detail[-2:-1] in "([":
            detail += ' (list values are quoted strings, e.g. "(832, 1344)")'
        return SpecError(
            detail[:1].lower() + detail[1:],
            source=source,
            line=line,
            field=".".join(path) if path else "",
        )
    return SpecError(f"syntax error: {message}", source=source, line=line)
