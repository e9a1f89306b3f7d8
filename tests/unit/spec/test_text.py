"""TAO spec text: published samples parse unchanged, syntax errors name field and line, and
text -> model -> text -> model is lossless."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from google.protobuf import text_format
from google.protobuf.message import Message

from maskops.spec import (
    ExperimentSpec,
    SpecError,
    experiment_pb2,
    load_spec,
    parse_spec_text,
    spec_from_json,
    spec_to_text,
)
from maskops.spec.models import DataConfig, MaskRCNNConfig

from .conftest import FIXTURES, TAO_SAMPLES


def _error(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source="spec.txt")
    return info.value


def test_published_samples_are_present() -> None:
    assert len(TAO_SAMPLES) >= 3


def test_tao_sample_parses_unchanged(tao_sample: Path) -> None:
    text = tao_sample.read_text()
    assert "#" in text  # comments are part of what must parse
    spec = load_spec(tao_sample)
    data, mrcnn = spec.data_config, spec.maskrcnn_config
    assert data.image_size == (832, 1344)
    assert data.num_classes == 91
    assert mrcnn.nlayers == 50
    assert mrcnn.freeze_blocks == [0, 1]
    assert mrcnn.freeze_bn is True
    assert mrcnn.bbox_reg_weights == (10.0, 10.0, 5.0, 5.0)
    assert mrcnn.aspect_ratios == [(1.0, 1.0), (1.4, 0.7), (0.7, 1.4)]
    assert mrcnn.anchor_scale == 8.0
    assert mrcnn.rpn_min_size == 0.0
    assert len(spec.learning_rate_steps) == len(spec.learning_rate_decay_levels) == 3


def test_tutorial_sample_values_and_defaults() -> None:
    spec = load_spec(FIXTURES / "tao_tutorials_maskrcnn_train_resnet50.txt")
    assert spec.learning_rate_steps == [100000, 150000, 200000]
    assert spec.learning_rate_decay_levels == [0.1, 0.02, 0.01]
    assert spec.l2_weight_decay == 0.00004
    assert spec.init_learning_rate == 0.005
    assert spec.resolved_total_steps == 250000
    assert spec.checkpoint.endswith("resnet50.hdf5")
    assert spec.data_config.training_file_pattern.endswith("train*.tfrecord")
    # Not written in the sample: TAO's documented defaults apply.
    assert spec.data_config.n_workers == DataConfig().n_workers == 16
    assert spec.data_config.max_num_instances == 200
    assert spec.l1_weight_decay == 0.0
    assert spec.pruned_model_path == ""


def test_num_epochs_overrides_total_steps() -> None:
    # The tf1 backend's default spec sets both total_steps and num_epochs.
    spec = load_spec(FIXTURES / "tao_tf1_backend_default.txt")
    assert spec.total_steps == 120000
    assert spec.num_epochs == 10
    assert spec.resolved_total_steps == 10 * 100 // 2


def test_retrain_sample_has_pruned_model_path() -> None:
    spec = load_spec(FIXTURES / "tao_tutorials_maskrcnn_retrain_resnet50.txt")
    assert spec.pruned_model_path.endswith("experiment_dir_pruned/model.tlt")
    assert spec.checkpoint == ""


def test_round_trip_of_samples(tao_sample: Path) -> None:
    spec = load_spec(tao_sample)
    text = spec_to_text(spec)
    again = parse_spec_text(text)
    assert again == spec
    assert spec_to_text(again) == text


def test_round_trip_of_unusual_values() -> None:
    spec = ExperimentSpec(
        seed=0,
        use_amp=True,
        init_learning_rate=0.0123456789012345,
        warmup_learning_rate=1e-7,
        l2_weight_decay=4e-5,
        learning_rate_steps=[7, 11],
        learning_rate_decay_levels=[1.0, 1 / 3],
        num_epochs=3,
        num_examples_per_epoch=17,
        train_batch_size=2,
        checkpoint='weights/with "quotes" and \\ back',
        pruned_model_path="/données/模型.pth",
        skip_checkpoint_variables=r"^(roi_heads|rpn)\.",
        keep_checkpoints=2,
        target_mask_ap=0.45,
        l1_weight_decay_layers="prunable",
        data_config=DataConfig(image_size=(128, 256), training_file_pattern="shards/train*"),
        maskrcnn_config=MaskRCNNConfig(
            nlayers=18,
            freeze_blocks=[],
            aspect_ratios=[(1.0, 1.0)],
            bbox_reg_weights=(1.5, 2.25, 0.1, 3.0),
            max_level=5,
            anchor_scale=4.5,
        ),
    )
    text = spec_to_text(spec)
    assert 'aspect_ratios: "[(1.0, 1.0)]"' in text
    assert 'freeze_blocks: "[]"' in text
    assert "keep_checkpoints: 2" in text
    assert "accumulate_grad_steps" not in text  # extension at its default: not written
    assert parse_spec_text(text) == spec


def test_default_spec_round_trips_and_writes_every_tao_field() -> None:
    text = spec_to_text(ExperimentSpec())
    assert parse_spec_text(text) == ExperimentSpec()
    written = {line.split(":")[0].strip() for line in text.splitlines() if ":" in line}
    left_out = {*ExperimentSpec.EXTENSION_FIELDS, *ExperimentSpec.OPTIONAL_TAO_FIELDS}
    tao_fields = (set(ExperimentSpec.model_fields) - left_out) - {
        "data_config",
        "maskrcnn_config",
    }
    assert tao_fields | set(DataConfig.model_fields) | set(MaskRCNNConfig.model_fields) <= written


def test_schema_and_model_have_the_same_fields() -> None:
    def names(message_type: type[Message]) -> set[str]:
        return {f.name for f in message_type.DESCRIPTOR.fields}

    assert names(experiment_pb2.Experiment) == set(ExperimentSpec.model_fields)
    assert names(experiment_pb2.DataConfig) == set(DataConfig.model_fields)
    assert names(experiment_pb2.MaskRCNNConfig) == set(MaskRCNNConfig.model_fields)


def test_output_is_plain_text_format() -> None:
    # What spec_to_text writes is valid protobuf text for the schema, comments included.
    message = experiment_pb2.Experiment()
    text_format.Parse(spec_to_text(ExperimentSpec()), message)
    assert message.maskrcnn_config.nlayers == 50
    assert message.data_config.image_size == "(832, 1344)"


def test_text_and_json_forms_agree(tao_sample: Path) -> None:
    spec = load_spec(tao_sample)
    assert spec_from_json(spec.model_dump(mode="json")) == spec


def test_empty_text_is_the_default_spec() -> None:
    assert parse_spec_text("# nothing but a comment\n") == ExperimentSpec()


def test_unknown_nested_field_suggests_the_right_name() -> None:
    err = _error("seed: 1\n# comment\nmaskrcnn_config {\n  nlayer: 18\n}\n")
    assert err.line == 4
    assert err.field == "maskrcnn_config.nlayer"
    assert str(err) == (
        "spec.txt:4: maskrcnn_config.nlayer: unknown field (did you mean 'nlayers'?)"
    )


def test_unknown_top_level_field_suggests_the_right_name() -> None:
    err = _error("seed: 1\ntrain_batchsize: 2\n")
    assert (err.line, err.field) == (2, "train_batchsize")
    assert "did you mean 'train_batch_size'?" in err.message


def test_unknown_field_without_close_match() -> None:
    err = _error("data_config {\n  zzz_qqq: 1\n}\n")
    assert (err.line, err.field, err.message) == (2, "data_config.zzz_qqq", "unknown field")


def test_field_in_the_wrong_block() -> None:
    err = _error("nlayers: 18\n")
    assert err.field == "nlayers"
    assert err.message == "unknown field at the top level; it belongs in maskrcnn_config"
    err = _error("data_config {\n  seed: 5\n}\n")
    assert err.message == "unknown field in data_config; it belongs at the top level"


def test_every_tao_5_3_field_is_accepted() -> None:
    # These were refused as "not supported" before maskops implemented them.
    spec = parse_spec_text(
        "save_checkpoints_steps: 5\nglobal_gradient_clip_ratio: 1.0\nlogging_frequency: 10\n"
        "report_frequency: 10\nwandb_config {\n}\nclearml_config {\n}\n"
    )
    assert spec.logging_frequency == 10 and spec.clearml_config is not None


def test_field_written_twice() -> None:
    err = _error("maskrcnn_config {\n  nlayers: 18\n  nlayers: 34\n}\n")
    assert (err.line, err.field, err.message) == (
        3,
        "maskrcnn_config.nlayers",
        "set more than once",
    )


def test_bad_scalar_value_names_field_and_line() -> None:
    err = _error("seed: 1\nmaskrcnn_config {\n  nlayers: fifty\n}\n")
    assert (err.line, err.field) == (3, "maskrcnn_config.nlayers")
    assert "fifty" in err.message
    err = _error("use_amp: maybe\n")
    assert (err.line, err.field) == (1, "use_amp")


def test_unquoted_list_value_explains_quoting() -> None:
    err = _error("data_config {\n  image_size: (832, 1344)\n}\n")
    assert (err.line, err.field) == (2, "data_config.image_size")
    assert "quoted strings" in err.message


def test_unclosed_block() -> None:
    err = _error("seed: 1\ndata_config {\n  num_classes: 3\n")
    assert err.line == 3
    assert err.message.startswith("syntax error")


def test_malformed_list_string() -> None:
    err = _error('maskrcnn_config {\n  aspect_ratios: "[(1.0, 1.0), (1.4 0.7)]"\n}\n')
    assert (err.line, err.field) == (2, "maskrcnn_config.aspect_ratios")
    assert "cannot read" in err.message
    err = _error('maskrcnn_config {\n\n  bbox_reg_weights: "(10., 10., 5.)"\n}\n')
    assert (err.line, err.field) == (3, "maskrcnn_config.bbox_reg_weights")
    assert "too few values" in err.message


def test_load_spec_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "missing.txt")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"seed: 1\n\xff\xfe")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(binary)
    bad_json = tmp_path / "spec.json"
    bad_json.write_text('{\n  "seed": 1,\n  "use_amp": tru\n}\n')
    with pytest.raises(SpecError) as info:
        load_spec(bad_json)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{bad_json}:3: invalid JSON")


def test_resolve_paths(tmp_path: Path) -> None:
    spec = ExperimentSpec(
        checkpoint="weights/r18.pth",
        pruned_model_path="/abs/model.pth",
        data_config=DataConfig(
            training_file_pattern="shards/train*", val_json_file="../ann/val.json"
        ),
    )
    resolved = spec.resolve_paths(tmp_path)
    assert resolved.checkpoint == str(tmp_path / "weights/r18.pth")
    assert resolved.pruned_model_path == "/abs/model.pth"
    assert resolved.data_config.training_file_pattern == str(tmp_path / "shards/train*")
    assert resolved.data_config.val_json_file == str(tmp_path / "../ann/val.json")
    assert resolved.data_config.validation_file_pattern == ""
    assert resolved.skip_checkpoint_variables == ""
    # The original is untouched (load_spec is lossless; resolving is a separate step).
    assert spec.data_config.training_file_pattern == "shards/train*"


def test_load_spec_keeps_relative_paths(tmp_path: Path) -> None:
    path = tmp_path / "spec.txt"
    path.write_text('data_config {\n  training_file_pattern: "shards/train*"\n}\n')
    spec = load_spec(path)
    assert spec.data_config.training_file_pattern == "shards/train*"
    resolved = spec.resolve_paths(path.parent)
    assert resolved.data_config.training_file_pattern == str(tmp_path / "shards" / "train*")


def test_misspelt_field_in_the_wrong_block_suggests_its_full_path() -> None:
    err = _error("maskrcnn_config {\n  image_sizes: 1\n}\n")
    assert err.message == "unknown field (did you mean 'data_config.image_size'?)"


def test_alternative_block_syntax_keeps_lines() -> None:
    text = "seed: 1;\nmaskrcnn_config: <\n  arch: 'resnet'\n  nlayers: 42\n>\n"
    err = _error(text)
    assert (err.line, err.field) == (4, "maskrcnn_config.nlayers")


def test_block_written_twice() -> None:
    err = _error("data_config {\n  num_classes: 3\n}\ndata_config {\n  n_workers: 2\n}\n")
    assert (err.line, err.field, err.message) == (4, "data_config", "set more than once")


def test_spec_error_survives_pickling() -> None:
    err = _error("maskrcnn_config {\n  nlayers: 42\n}\n")
    again = pickle.loads(pickle.dumps(err))
    assert (again.source, again.line, again.field, again.message) == (
        err.source,
        err.line,
        err.field,
        err.message,
    )
    assert str(again) == str(err)


def test_windows_line_endings_and_bom(tmp_path: Path) -> None:
    sample = FIXTURES / "tao_tutorials_maskrcnn_train_resnet50.txt"
    text = sample.read_text()
    path = tmp_path / "spec.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    assert load_spec(path) == load_spec(sample)
    path.write_bytes(text.replace("\n", "\r\n").replace("nlayers: 50", "nlayers: 42").encode())
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.line == 1 + text.splitlines().index("    nlayers: 50")
