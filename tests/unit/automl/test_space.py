"""The search space: spec fields checked against the schema, default ranges, TAO API's
AutoML option names, and the algorithms as Optuna samplers and pruners."""

from __future__ import annotations

from typing import Any, get_args

import optuna
import pytest

from maskops.automl.space import DEFAULT_SPACE, SpaceError, apply_params, resolve_space
from maskops.automl.study import (
    ALGORITHMS,
    SAMPLERS,
    SearchSettings,
    direction,
    make_pruner,
    make_sampler,
)
from maskops.spec.models import ExperimentSpec
from maskops_core.options import AutomlOptions
from maskops_worker.automl import search_settings


def test_no_space_searches_the_mask_rcnn_defaults() -> None:
    space = {param.path: param for param in resolve_space(None)}
    assert set(space) == set(DEFAULT_SPACE)
    assert space["init_learning_rate"].kind == "float" and space["init_learning_rate"].log
    assert space["warmup_steps"].kind == "int"
    assert space["maskrcnn_config.batch_size_per_im"].choices == (128, 256, 512)


def test_a_listed_field_gets_a_range_around_its_value() -> None:
    base = ExperimentSpec(seed=10)
    (weight,) = resolve_space(["maskrcnn_config.rpn_box_loss_weight"], base)
    assert (weight.low, weight.high, weight.log) == pytest.approx((0.1, 10.0, True))
    (seed,) = resolve_space(["seed"], base)
    assert (seed.kind, seed.low, seed.high) == ("int", 5, 20)
    (flip,) = resolve_space(["use_amp"], base)
    assert flip.choices == (False, True)


@pytest.mark.parametrize(
    ("fields", "named", "message"),
    [
        ({"maskrcnn_config.nope": {}}, "maskrcnn_config.nope", "no field"),
        ({"data_config": {}}, "data_config", "only number"),
        ({"init_learning_rate": {"min": 0.1, "max": 0.01}}, "init_learning_rate", "min < max"),
        ({"init_learning_rate": {"min": 0.0, "max": 1, "log": True}}, "init_learning_rate", ""),
        ({"warmup_steps": {"min": 0.5, "max": 3}}, "warmup_steps", "integer"),
        ({"maskrcnn_config.anchor_scale": {"choices": [-1.0, 2.0]}}, "anchor_scale", "valid"),
        ({"seed": {"min": 1, "max": 2, "step": 1}}, "seed", "unknown keys"),
        ({"maskrcnn_config.arch": {}}, "maskrcnn_config.arch", "range"),
        # x0.1..x10 of 0.9 leaves [0, 1): a bounded field needs its own range.
        ({"momentum": {}}, "momentum", "9.0 is not a valid value"),
    ],
)
def test_a_field_the_schema_refuses_is_named(
    fields: dict[str, Any], named: str, message: str
) -> None:
    with pytest.raises(SpaceError) as caught:
        resolve_space(fields)
    assert named in caught.value.field and message in str(caught.value)


def test_overrides_and_removals_as_tao_names_them() -> None:
    options = AutomlOptions.model_validate(
        {
            "automl_algorithm": "HyperBand",
            "automl_max_recommendations": 6,
            "automl_hyperparameters": ["init_learning_rate", "l2_weight_decay"],
            "automl_add_hyperparameters": ["maskrcnn_config.anchor_scale"],
            "automl_remove_hyperparameters": ["l2_weight_decay"],
            "automl_range_override": [
                {"parameter": "init_learning_rate", "valid_min": 0.001, "valid_max": 0.01}
            ],
            "automl_nu": 2,
        }
    )
    assert options.algorithm == "hyperband" and options.max_recommendations == 6
    assert options.reduction_factor == 2
    space = resolve_space(
        options.search_space(),
        overrides=options.range_overrides(),
        remove=options.remove_hyperparameters,
    )
    assert [(p.path, p.low, p.high) for p in space] == [
        ("init_learning_rate", 0.001, 0.01),
        ("maskrcnn_config.anchor_scale", 2.0, 8.0),
    ]


def test_apply_params_validates_the_whole_spec() -> None:
    spec = apply_params(ExperimentSpec(), {"maskrcnn_config.anchor_scale": 4.0, "seed": 3})
    assert spec.maskrcnn_config.anchor_scale == 4.0 and spec.seed == 3
    with pytest.raises(ValueError, match="anchor_scale"):
        apply_params(ExperimentSpec(), {"maskrcnn_config.anchor_scale": 0.0})


def test_the_rest_options_offer_the_engines_algorithms_and_samplers() -> None:
    fields = AutomlOptions.model_fields
    assert set(get_args(fields["algorithm"].annotation)) == set(ALGORITHMS)
    (samplers, _) = get_args(fields["sampler"].annotation)  # Literal[...] | None
    assert set(get_args(samplers)) == set(SAMPLERS)


@pytest.mark.parametrize(
    ("algorithm", "sampler", "pruner"),
    [
        ("bayesian", optuna.samplers.GPSampler, optuna.pruners.MedianPruner),
        ("random", optuna.samplers.RandomSampler, optuna.pruners.MedianPruner),
        ("hyperband", optuna.samplers.TPESampler, optuna.pruners.HyperbandPruner),
        ("asha", optuna.samplers.TPESampler, optuna.pruners.SuccessiveHalvingPruner),
    ],
)
def test_algorithms_map_to_optuna(algorithm: str, sampler: type, pruner: type) -> None:
    settings = SearchSettings(algorithm=algorithm, min_resource=2, max_resource=8)
    assert isinstance(make_sampler(settings), sampler)
    assert isinstance(make_pruner(settings), pruner)
    none = SearchSettings(algorithm=algorithm, pruner="none")
    assert isinstance(make_pruner(none), optuna.pruners.NopPruner)
    assert SearchSettings.from_attributes(settings.attributes()) == SearchSettings(
        algorithm=algorithm,
        sampler=settings.resolved_sampler,
        pruner=settings.resolved_pruner,
        min_resource=2,
        max_resource=8,
    )


@pytest.mark.parametrize(
    ("name", "sampler"),
    [
        ("tpe", optuna.samplers.TPESampler),
        ("gp", optuna.samplers.GPSampler),
        ("random", optuna.samplers.RandomSampler),
    ],
)
def test_a_named_sampler_replaces_the_algorithms(name: str, sampler: type) -> None:
    options = AutomlOptions.model_validate(
        {"automl_algorithm": "bayesian", "sampler": name.upper()}
    )
    assert options.sampler == name
    settings = search_settings(options, ExperimentSpec())  # the search controller's
    assert isinstance(make_sampler(settings), sampler)
    assert settings.attributes()["sampler"] == name


def test_losses_are_minimised_and_ap_maximised() -> None:
    assert direction("val/Total loss") == "minimize"
    assert direction("mask_AP") == direction("AP50") == "maximize"


@pytest.mark.parametrize(
    ("field", "choice"),
    [("checkpoint", "/etc/hostname"), ("data_config.training_file_pattern", "/etc/*")],
)
def test_the_worker_confines_a_stored_searchs_path_choices(field: str, choice: str) -> None:
    """A search stored before the API held its choices to the server's paths: its
    controller refuses it, naming the field, before any trial opens the path."""
    from maskops_core.settings import Settings
    from maskops_worker.automl import search_space
    from maskops_worker.contract import JobInputError

    options = AutomlOptions.model_validate({"hyperparameters": {field: {"choices": [choice]}}})
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    with pytest.raises(JobInputError, match=f"options.hyperparameters.{field}: must be"):
        search_space(options, ExperimentSpec(), settings)
