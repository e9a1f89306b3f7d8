"""What maskops writes, TAO's own schema reads.

TAO's experiment.proto types every integer as uint32, every real as 32-bit float (except
anchor_scale, a uint32) and has no maskops extension fields. The schema below is derived from
maskops' schema with exactly those differences, so a spec_to_text output that it parses is
one `tao mask_rcnn` accepts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import Message

from maskops.spec import ExperimentSpec, experiment_pb2, load_spec, spec_to_text
from maskops.spec.models import MaskRCNNConfig

Field = descriptor_pb2.FieldDescriptorProto
EXTENSION_NUMBERS_FROM = 100


def _tao_schema() -> type[Message]:
    proto = descriptor_pb2.FileDescriptorProto()
    experiment_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name, proto.package = "tao_schema_for_tests.proto", "tao"
    for message in proto.message_type:
        kept = [f for f in message.field if f.number < EXTENSION_NUMBERS_FROM]
        del message.field[:]
        for field in kept:
            if field.type == Field.TYPE_INT64 or field.name == "anchor_scale":
                field.type = Field.TYPE_UINT32
            elif field.type == Field.TYPE_DOUBLE:
                field.type = Field.TYPE_FLOAT
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(".maskops.spec.", ".tao.")
            # TAO's fields are plain proto3 scalars, without presence.
            field.ClearField("proto3_optional")
            field.ClearField("oneof_index")
            message.field.append(field)
        message.ClearField("oneof_decl")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tao.Experiment"))


TAO_EXPERIMENT = _tao_schema()


def _tao_parse(text: str) -> Message:
    message = TAO_EXPERIMENT()
    text_format.Parse(text, message)
    return message


def test_tao_schema_reads_the_published_samples(tao_sample: Path) -> None:
    # Sanity check of the derived schema itself.
    _tao_parse(tao_sample.read_text())


def test_tao_schema_reads_what_maskops_writes(tao_sample: Path) -> None:
    spec = load_spec(tao_sample)
    message = _tao_parse(spec_to_text(spec))
    assert message.maskrcnn_config.anchor_scale == 8  # type: ignore[attr-defined]
    assert message.data_config.image_size == "(832, 1344)"  # type: ignore[attr-defined]


def test_tao_schema_reads_the_default_spec() -> None:
    _tao_parse(spec_to_text(ExperimentSpec()))


def test_extensions_and_fractional_anchor_scale_are_maskops_only() -> None:
    with pytest.raises(text_format.ParseError, match="keep_checkpoints"):
        _tao_parse(spec_to_text(ExperimentSpec(keep_checkpoints=3)))
    spec = ExperimentSpec(maskrcnn_config=MaskRCNNConfig(anchor_scale=4.5))
    assert "anchor_scale: 4.5" in spec_to_text(spec)


def test_committed_module_matches_the_proto(tmp_path: Path) -> None:
    # experiment_pb2.py is generated and committed: it must be regenerated with the .proto.
    protoc = pytest.importorskip("grpc_tools.protoc")
    root = Path(experiment_pb2.__file__).resolve().parents[2]
    out = tmp_path / "experiment.desc"
    args = ["protoc", f"-I{root}", f"--descriptor_set_out={out}", "maskops/spec/experiment.proto"]
    assert protoc.main(args) == 0
    generated = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    for message in generated.message_type:
        for field in message.field:
            field.ClearField("json_name")  # derived by protoc, not kept in the generated module
    committed = descriptor_pb2.FileDescriptorProto()
    experiment_pb2.DESCRIPTOR.CopyToProto(committed)
    assert generated == committed
