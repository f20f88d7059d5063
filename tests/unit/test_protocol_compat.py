"""Older peers still speak to this protocol: field numbers that once carried the round streams and the round
lane stay reserved (never reused), and an older service's Info, with them set, still parses and reads as the
fields this version knows."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2

from specdec.v1 import common_pb2, draft_pb2, target_pb2

RESERVED = [
    (common_pb2.ModelInfo, {21, 22, 23}, {"round_streams", "round_lane_port", "round_lane_forward_done"}),
    (common_pb2.ServiceStats, {21, 22}, {"lane_calls", "lane_forward_done"}),
    (draft_pb2.ProposeRequest, {11}, {"timeout_ms"}),
    (target_pb2.VerifyRequest, {12}, {"timeout_ms"}),
]
WIRE_VARINT = 0
OLD_LANE_PORT = 50062
SEVEN_BITS, MORE = 0x7F, 0x80


def varint(value: int) -> bytes:
    out = bytearray()
    while value > SEVEN_BITS:
        out.append(value & SEVEN_BITS | MORE)
        value >>= 7
    return bytes(out + bytes([value]))


def varint_field(number: int, value: int) -> bytes:
    """One varint field on the wire (tag, value)."""
    return varint(number << 3 | WIRE_VARINT) + varint(value)


@pytest.mark.parametrize("message, numbers, names", RESERVED, ids=lambda v: getattr(v, "__name__", ""))
def test_the_removed_fields_stay_reserved(message, numbers, names):
    proto = descriptor_pb2.DescriptorProto()
    message.DESCRIPTOR.CopyToProto(proto)
    reserved = {n for r in proto.reserved_range for n in range(r.start, r.end)}
    assert numbers <= reserved and names <= set(proto.reserved_name)
    assert not numbers & {f.number for f in message.DESCRIPTOR.fields}


def test_an_older_services_info_parses_and_says_no_more_than_this_version_knows():
    new = common_pb2.ModelInfo(protocol_version="specdec.v1", role="target", context_delta=True)
    old = new.SerializeToString() + varint_field(21, 1) + varint_field(22, OLD_LANE_PORT) + varint_field(23, 1)
    parsed = common_pb2.ModelInfo.FromString(old)
    assert parsed.role == "target" and parsed.context_delta
    assert parsed.ListFields() == new.ListFields()  # the old fields are unknown bytes, read by no one
