"""Every validation rule rejects a broken spec with the field's name and, for text, its line;
the JSON form gets the same checks with the JSON field path."""

from __future__ import annotations

import pytest

from maskops.spec import ExperimentSpec, SpecError, parse_spec_text, spec_from_json, spec_to_text
from maskops.spec.models import MaskRCNNConfig

# (text, field, line, message) — each text has one broken field; `line` is where the error
# must point (the blamed field's own line, or a related field's when the blamed one is unset).
CASES = [
    pytest.param(
        "seed: 1\n\nmaskrcnn_config {\n  nlayers: 42\n}\n",
        "maskrcnn_config.nlayers",
        4,
        "42 is not one of 10, 18, 34, 50, 101",
        id="nlayers",
    ),
    pytest.param(
        'maskrcnn_config {\n  freeze_blocks: "[0, 4]"\n}\n',
        "maskrcnn_config.freeze_blocks",
        2,
        "[0, 4] is not a subset of [0, 1, 2, 3]",
        id="freeze_blocks",
    ),
    pytest.param(
        'maskrcnn_config {\n  freeze_blocks: "[1, 1]"\n}\n',
        "maskrcnn_config.freeze_blocks",
        2,
        "[1, 1] lists a block more than once",
        id="freeze_blocks_duplicate",
    ),
    pytest.param(
        'data_config {\n  num_classes: 3\n  image_size: "(64, 128)"\n}\n',
        "data_config.image_size",
        3,
        "(64, 128): height and width must be >= 128",
        id="image_size_min",
    ),
    pytest.param(
        'data_config {\n  image_size: "(832, 1000)"\n}\n',
        "data_config.image_size",
        2,
        "(832, 1000): height and width must be multiples of 2^max_level = 64",
        id="image_size_stride",
    ),
    pytest.param(
        'data_config {\n  image_size: "(832, 1344)"\n}\nmaskrcnn_config {\n  max_level: 7\n}\n',
        "data_config.image_size",
        2,
        "(832, 1344): height and width must be multiples of 2^max_level = 128",
        id="image_size_stride_max_level",
    ),
    pytest.param(
        'learning_rate_steps: "[200, 100]"\nlearning_rate_decay_levels: "[0.1, 0.01]"\n',
        "learning_rate_steps",
        1,
        "[200, 100] must be strictly increasing",
        id="lr_steps_increasing",
    ),
    pytest.param(
        'learning_rate_steps: "[100, 200]"\nlearning_rate_decay_levels: "[0.1]"\n',
        "learning_rate_decay_levels",
        2,
        "1 levels for 2 learning_rate_steps; they must have the same length",
        id="lr_levels_length",
    ),
    pytest.param(
        'seed: 3\nlearning_rate_steps: "[100, 200]"\n',
        "learning_rate_decay_levels",
        2,
        "0 levels for 2 learning_rate_steps; they must have the same length",
        id="lr_levels_missing",
    ),
    pytest.param(
        "maskrcnn_config {\n  mrcnn_resolution: 30\n}\n",
        "maskrcnn_config.mrcnn_resolution",
        2,
        "30 is not a multiple of 4",
        id="mrcnn_resolution",
    ),
    pytest.param(
        "data_config {\n  num_classes: 1\n}\n",
        "data_config.num_classes",
        2,
        "1 must be >= 2 (categories + 1 for background)",
        id="num_classes",
    ),
    pytest.param(
        "maskrcnn_config {\n  min_level: 4\n  max_level: 3\n}\n",
        "maskrcnn_config.max_level",
        3,
        "3 must be greater than min_level (4)",
        id="min_max_level",
    ),
    pytest.param(
        "maskrcnn_config {\n  min_level: 1\n}\n",
        "maskrcnn_config.min_level",
        2,
        "1 must be in 2..5 (FPN levels start at a ResNet stage)",
        id="min_level_range",
    ),
    pytest.param(
        "maskrcnn_config {\n  fg_fraction: 1.5\n}\n",
        "maskrcnn_config.fg_fraction",
        2,
        "1.5 must be in [0, 1]",
        id="fraction",
    ),
    pytest.param(
        "maskrcnn_config {\n  test_nms: -0.1\n}\n",
        "maskrcnn_config.test_nms",
        2,
        "-0.1 must be in [0, 1]",
        id="threshold",
    ),
    pytest.param(
        "maskrcnn_config {\n  bg_thresh_hi: 0.4\n  bg_thresh_lo: 0.45\n}\n",
        "maskrcnn_config.bg_thresh_lo",
        3,
        "0.45 must be <= bg_thresh_hi (0.4)",
        id="bg_thresh_order",
    ),
    pytest.param(
        "maskrcnn_config {\n  rpn_positive_overlap: 0.2\n}\n",
        "maskrcnn_config.rpn_negative_overlap",
        2,
        "0.3 must be <= rpn_positive_overlap (0.2)",
        id="rpn_overlap_order",
    ),
    pytest.param(
        "num_epochs: 12\ntrain_batch_size: 2\n",
        "num_examples_per_epoch",
        1,
        "required (> 0) when num_epochs is set (12)",
        id="num_epochs_needs_examples",
    ),
    pytest.param("train_batch_size: 0\n", "train_batch_size", 1, "0 must be > 0", id="batch_size"),
    pytest.param("seed: -1\n", "seed", 1, "-1 must be >= 0", id="negative"),
    pytest.param(
        "init_learning_rate: nan\n",
        "init_learning_rate",
        1,
        "Input should be a finite number",
        id="nan",
    ),
    pytest.param("momentum: 1.0\n", "momentum", 1, "1.0 must be in [0, 1)", id="momentum"),
    pytest.param(
        'maskrcnn_config {\n  arch: "vgg"\n}\n',
        "maskrcnn_config.arch",
        2,
        "'vgg' is not supported (only 'resnet')",
        id="arch",
    ),
    pytest.param(
        'skip_checkpoint_variables: "rpn.(head"\n',
        "skip_checkpoint_variables",
        1,
        "is not a valid regular expression",
        id="regex",
    ),
    pytest.param(
        'maskrcnn_config {\n  aspect_ratios: "[]"\n}\n',
        "maskrcnn_config.aspect_ratios",
        2,
        "at least one (x, y) aspect ratio is needed",
        id="aspect_ratios_empty",
    ),
    pytest.param(
        'maskrcnn_config {\n  bbox_reg_weights: "(10., 0., 5., 5.)"\n}\n',
        "maskrcnn_config.bbox_reg_weights",
        2,
        "every weight must be > 0",
        id="bbox_reg_weights",
    ),
    pytest.param(
        "maskrcnn_config {\n  gt_mask_size: 0\n}\n",
        "maskrcnn_config.gt_mask_size",
        2,
        "0 must be > 0",
        id="gt_mask_size",
    ),
    pytest.param(
        "target_mask_ap: 45\n", "target_mask_ap", 1, "45.0 must be in [0, 1]", id="extension"
    ),
    pytest.param(
        'seed: 1\nl1_weight_decay_layers: "heads"\n',
        "l1_weight_decay_layers",
        2,
        "'heads' must be one of all, prunable",
        id="l1_weight_decay_layers",
    ),
]


@pytest.mark.parametrize(("text", "field", "line", "message"), CASES)
def test_text_rule(text: str, field: str, line: int, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source="spec.txt")
    err = info.value
    assert err.field == field
    assert err.line == line
    assert message in err.message
    assert str(err).startswith(f"spec.txt:{line}: {field}: ")
    assert "\n" not in str(err)


def test_error_string_is_exactly_the_documented_form() -> None:
    text = "\n" * 22 + "maskrcnn_config { nlayers: 42 }\n"
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source="spec.txt")
    assert (
        str(info.value)
        == "spec.txt:23: maskrcnn_config.nlayers: 42 is not one of 10, 18, 34, 50, 101"
    )


def test_first_error_in_the_file_is_reported() -> None:
    text = "maskrcnn_config {\n  nlayers: 42\n}\ndata_config {\n  num_classes: 1\n}\n"
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source="spec.txt")
    assert info.value.line == 2


def test_blamed_field_at_default_has_no_line_when_nothing_related_is_written() -> None:
    # max_level at its default (6) but min_level written as 6: the related field's line.
    with pytest.raises(SpecError) as info:
        parse_spec_text("maskrcnn_config {\n  min_level: 5\n  max_level: 5\n}\n")
    assert info.value.line == 3


def test_resolved_total_steps() -> None:
    spec = parse_spec_text("num_epochs: 3\nnum_examples_per_epoch: 10\ntrain_batch_size: 4\n")
    # TAO's train.py (nvidia_tao_tf1/cv/mask_rcnn/scripts/train.py) rounds up: the last,
    # partial batch of the epochs is a step too. 30 examples at batch 4 are 8 steps.
    assert spec.resolved_total_steps == 8
    assert spec.total_steps == 0  # kept as written: the text round-trips
    assert parse_spec_text(spec_to_text(spec)) == spec
    assert parse_spec_text("total_steps: 99\n").resolved_total_steps == 99


def test_epochs_shorter_than_a_batch_are_one_step() -> None:
    # TAO trains (num_epochs * num_examples_per_epoch + train_batch_size - 1) //
    # train_batch_size steps: one epoch of 3 examples at batch 4 is one step, not an error.
    text = "num_epochs: 1\nnum_examples_per_epoch: 3\ntrain_batch_size: 4\n"
    assert parse_spec_text(text).resolved_total_steps == 1


JSON_CASES = [
    ({"maskrcnn_config": {"nlayers": 42}}, "maskrcnn_config.nlayers", "42 is not one of"),
    ({"data_config": {"image_size": [832, 1000]}}, "data_config.image_size", "2^max_level"),
    ({"data_config": {"image_size": "(832, 1000)"}}, "data_config.image_size", "2^max_level"),
    ({"learning_rate_steps": [5, 10]}, "learning_rate_decay_levels", "same length"),
    ({"num_epochs": 2}, "num_examples_per_epoch", "required"),
    ({"maskrcnn_config": {"nlayer": 18}}, "maskrcnn_config.nlayer", "did you mean 'nlayers'?"),
    ({"data_config": {"image_size": [832, "x"]}}, "data_config.image_size[1]", "valid integer"),
    (
        {"maskrcnn_config": {"aspect_ratios": [[1, 1], [2]]}},
        "maskrcnn_config.aspect_ratios[1]",
        "too few values",
    ),
    ({"maskrcnn_config": {"freeze_blocks": [0, 7]}}, "maskrcnn_config.freeze_blocks", "subset"),
    ({"data_config": 5}, "data_config", "valid dictionary"),
]


@pytest.mark.parametrize(("obj", "field", "message"), JSON_CASES)
def test_json_rule(obj: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from_json(obj, source="body")
    err = info.value
    assert (err.field, err.line) == (field, None)
    assert message in err.message
    assert str(err).startswith(f"body: {field}: ")


def test_json_accepts_typed_and_tao_string_lists() -> None:
    typed = spec_from_json(
        {"maskrcnn_config": {"aspect_ratios": [[1.0, 1.0], [1.4, 0.7]], "freeze_blocks": [0]}}
    )
    tao = spec_from_json(
        {"maskrcnn_config": {"aspect_ratios": "[(1.0, 1.0), (1.4, 0.7)]", "freeze_blocks": "[0]"}}
    )
    assert typed == tao
    assert typed.maskrcnn_config.aspect_ratios == [(1.0, 1.0), (1.4, 0.7)]


def test_json_rejects_non_objects() -> None:
    with pytest.raises(SpecError, match="must be an object"):
        spec_from_json([1, 2])


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ValueError, match="is not one of"):
        MaskRCNNConfig(nlayers=42)
    spec = ExperimentSpec()
    with pytest.raises(ValueError, match="multiple of 4"):
        spec.maskrcnn_config.mrcnn_resolution = 30


def test_json_integers_must_fit_the_text_form() -> None:
    with pytest.raises(SpecError, match=r"total_steps: .* is out of range"):
        spec_from_json({"total_steps": 2**70})
    with pytest.raises(SpecError, match=r"seed: .* must be < 2\^32"):
        spec_from_json({"seed": 2**40})
