"""specdec/proto_json.py, the one proto -> JSON converter (HTTP extension, CLI, Python client)."""

from __future__ import annotations

import json
import math

from http_gateway.openai_schema import extension
from specdec.proto_json import message_to_dict
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import target_pb2


def test_gateway_extension_prints_every_stats_and_round_field_in_field_order():
    stats = pb.Stats(rounds=3, wire_bytes=2**40, accepted_per_position=[2, 1], acceptance_rate=0.5)
    trace = [pb.Round(index=0, k=2, matches=[True, False], next_kind=target_pb2.NEXT_KIND_RECOVERED, wire_bytes=7)]
    ext = extension("s", "r", pb.FINISH_REASON_LENGTH, stats=stats, trace=trace)
    assert list(ext["stats"]) == [f.name for f in pb.Stats.DESCRIPTOR.fields]  # zeros too, proto order
    assert list(ext["trace"][0]) == [f.name for f in pb.Round.DESCRIPTOR.fields]
    assert ext["stats"]["wire_bytes"] == 2**40 and isinstance(ext["stats"]["wire_bytes"], int)  # not "1099511627776"
    assert (ext["stats"]["rounds"], ext["stats"]["draft_tokens"], ext["stats"]["accepted_per_position"]) == (
        3,
        0,
        [2, 1],
    )
    round0 = ext["trace"][0]
    assert (round0["next_kind"], round0["matches"], round0["target_ids"], round0["wire_bytes"]) == (
        "NEXT_KIND_RECOVERED",
        [True, False],
        [],
        7,
    )
    assert (ext["finish_reason"], ext["finish_detail"]) == ("length", "length")


def test_non_finite_doubles_stay_valid_json():
    data = message_to_dict(pb.Stats(acceptance_rate=math.nan, total_ms=math.inf), all_fields=True)
    assert (data["acceptance_rate"], data["total_ms"]) == ("NaN", "Infinity")
    json.dumps(data, allow_nan=False)  # a bare float NaN would not be JSON


def test_without_all_fields_defaults_are_left_out():
    assert message_to_dict(pb.Stats(rounds=2)) == {"rounds": 2}
    assert message_to_dict(pb.GenerateResponse(text="x")) == {"text": "x"}  # unset message fields too
