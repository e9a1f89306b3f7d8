"""The search space: spec fields (dotted paths of :class:`ExperimentSpec`) with a range or
a list of choices, checked against the spec schema, and applied to a spec for one trial.

This module imports no model code and no Optuna at import time: the API checks a search
space at the door with it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ValidationError

from maskops.spec.models import ExperimentSpec

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

Choice = bool | int | float | str


class SpaceError(ValueError):
    """A search space field that the spec schema does not allow; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Param:
    """One searched field: a numeric range (``low``..``high``, ``log`` scale, integer when
    the field is) or ``choices``."""

    path: str
    kind: str
    """``float``, ``int`` or ``categorical``."""
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Choice, ...] = ()

    def values(self) -> tuple[Choice, ...]:
        """What a trial may set: every choice, or both ends of the range."""
        if self.kind == "categorical":
            return self.choices
        if self.kind == "int":
            return (int(self.low), int(self.high))
        return (float(self.low), float(self.high))

    def distribution(self) -> BaseDistribution:
        """The Optuna distribution sampling this field."""
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.kind == "categorical":
            return CategoricalDistribution(self.choices)
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log)
        return FloatDistribution(self.low, self.high, log=self.log)

    def suggest(self, trial: optuna.Trial) -> Choice:
        """This field's value for ``trial``, sampled by its study's sampler."""
        if self.kind == "categorical":
            value = trial.suggest_categorical(self.path, self.choices)
            assert value is not None, "choices hold no None"
            return value
        if self.kind == "int":
            return trial.suggest_int(self.path, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.path, self.low, self.high, log=self.log)

    def to_json(self) -> dict[str, Any]:
        if self.kind == "categorical":
            return {"choices": list(self.choices)}
        return {"min": self.low, "max": self.high, "log": self.log, "type": self.kind}


DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "init_learning_rate": {"min": 1e-3, "max": 5e-2, "log": True},
    "warmup_steps": {"min": 0, "max": 1000},
    "warmup_learning_rate": {"min": 1e-5, "max": 1e-3, "log": True},
    "l2_weight_decay": {"min": 1e-6, "max": 1e-3, "log": True},
    "maskrcnn_config.anchor_scale": {"min": 2.0, "max": 8.0},
    "maskrcnn_config.rpn_batch_size_per_im": {"choices": [128, 256, 512]},
    "maskrcnn_config.batch_size_per_im": {"choices": [128, 256, 512]},
}
"""The fields searched when a search names none, with their ranges: the learning rate and
its warm-up (at most a quarter of the spec's steps), weight decay, anchor scale and the
RPN / RoI sampling batch sizes. A search
that names a field without a range gets this range, or the field's value x0.1..x10 (log
scale) for another float, x0.5..x2 for another integer."""


def _field_type(path: str) -> type:
    """The Python type of spec field ``path`` (a dotted path through the config blocks)."""
    model: type[BaseModel] = ExperimentSpec
    parts = path.split(".")
    for index, name in enumerate(parts):
        field = model.model_fields.get(name)
        if field is None:
            raise SpaceError(path, f"the spec has no field {'.'.join(parts[: index + 1])!r}")
        annotation = field.annotation
        if index == len(parts) - 1:
            if annotation in (bool, int, float, str):
                return cast(type, annotation)
            raise SpaceError(path, "only number, boolean and text fields can be searched")
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise SpaceError(path, f"{name!r} is not a config block")
        model = annotation
    raise SpaceError(path, "empty field path")


def _spec_value(spec: ExperimentSpec, path: str) -> Any:
    value: Any = spec
    for name in path.split("."):
        value = getattr(value, name)
    return value


def _default_range(path: str, kind: type, base: ExperimentSpec) -> dict[str, Any]:
    if path == "warmup_steps" and base.resolved_total_steps > 0:
        # A warm-up as long as the run leaves no steps at the learning rate searched.
        return {"min": 0, "max": max(1, min(1000, base.resolved_total_steps // 4))}
    if path in DEFAULT_SPACE:
        return DEFAULT_SPACE[path]
    value = _spec_value(base, path)
    if kind is float and value > 0:
        return {"min": value / 10, "max": value * 10, "log": True}
    if kind is int and value > 0:
        return {"min": max(1, value // 2), "max": value * 2}
    if kind is bool:
        return {"choices": [False, True]}
    raise SpaceError(path, "give a range (min, max) or choices: its value is no starting point")


def _param(path: str, given: Mapping[str, Any], base: ExperimentSpec) -> Param:
    kind = _field_type(path)
    unknown = set(given) - {"min", "max", "log", "choices", "type"}
    if unknown:
        raise SpaceError(path, f"unknown keys {sorted(unknown)} (min, max, log, choices)")
    if not given:
        given = _default_range(path, kind, base)
    if "choices" in given:
        choices = tuple(given["choices"])
        if not choices or not all(isinstance(c, bool | int | float | str) for c in choices):
            raise SpaceError(path, "choices must be a non-empty list of numbers or texts")
        param = Param(path, "categorical", choices=choices)
        for choice in choices:
            _check_value(base, path, choice)
        return param
    if kind not in (int, float) or "min" not in given or "max" not in given:
        raise SpaceError(path, "a range needs min and max on a number field (or give choices)")
    low, high, log = given["min"], given["max"], bool(given.get("log", False))
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in (low, high)):
        raise SpaceError(path, "min and max must be finite numbers")
    if low >= high or (log and low <= 0):
        raise SpaceError(path, f"need min < max (and min > 0 on a log scale), got {low}..{high}")
    if kind is int and not (float(low).is_integer() and float(high).is_integer()):
        raise SpaceError(path, "an integer field takes integer min and max")
    param = Param(path, "int" if kind is int else "float", low=low, high=high, log=log)
    for bound in param.values():
        _check_value(base, path, bound)
    return param


def _check_value(base: ExperimentSpec, path: str, value: Choice) -> None:
    """``value`` in ``path`` must make a valid spec (the schema's own checks)."""
    try:
        apply_params(base, {path: value})
    except ValidationError as exc:
        message = exc.errors()[0]["msg"]
        raise SpaceError(path, f"{value!r} is not a valid value: {message}") from None


def resolve_space(
    fields: Mapping[str, Mapping[str, Any]] | Iterable[str] | None,
    base: ExperimentSpec | None = None,
    *,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    remove: Iterable[str] = (),
) -> list[Param]:
    """The searched fields, each checked against the spec schema (:class:`SpaceError` names
    the first wrong one). ``fields``: a mapping of path to range/choices, a list of paths
    (default ranges), or None for :data:`DEFAULT_SPACE`; ``overrides`` replace ranges,
    ``remove`` drops fields (TAO's automl_range_override / automl_remove_hyperparameters)."""
    base = base or ExperimentSpec()
    if fields is None:
        chosen: dict[str, Mapping[str, Any]] = {path: {} for path in DEFAULT_SPACE}
    elif isinstance(fields, Mapping):
        chosen = dict(fields)
    else:
        chosen = {path: {} for path in fields}
    chosen.update(overrides or {})
    for path in remove:
        chosen.pop(path, None)
    if not chosen:
        raise SpaceError("hyperparameters", "the search space is empty")
    return [_param(path, given or {}, base) for path, given in chosen.items()]


def apply_params(spec: ExperimentSpec, params: Mapping[str, Choice]) -> ExperimentSpec:
    """``spec`` with each dotted field set to its value, validated as a whole (a value the
    schema refuses raises :class:`pydantic.ValidationError`)."""
    data = spec.model_dump(mode="json")
    for path, value in params.items():
        *blocks, name = path.split(".")
        target = data
        for block in blocks:
            target = target.setdefault(block, {})
        target[name] = value
    return ExperimentSpec.model_validate(data)
