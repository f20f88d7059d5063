"""A round with nothing drafted (k = 0, or a draft that proposed nothing) emits the target's own next token:
neither a bonus (all drafts accepted) nor a recovered token (a rejected draft replaced). The trace, the stats,
the CLI's round table and the HTTP trace (the proto's enum name) call it a target token."""

from __future__ import annotations

from orchestrator.rounds import RoundOutcome
from orchestrator.stats import StatsCollector, count_emitted
from specdec.proto_json import message_to_dict
from specdec.report import round_table
from specdec.v1 import target_pb2

BONUS, TARGET = target_pb2.NEXT_KIND_BONUS, target_pb2.NEXT_KIND_TARGET


def draftless(k: int, next_token: int = 11) -> RoundOutcome:
    """What the target answers for a verify without drafts: all (none) accepted, its next token as `bonus`."""
    return RoundOutcome(
        k=k,
        draft_ids=[],
        matches=[],
        target_ids=[next_token],
        num_accepted=0,
        next_token=next_token,
        next_kind=BONUS,
        emitted=[next_token],
    )


def test_a_draftless_round_emits_a_target_token_not_a_bonus():
    for k in (0, 4):  # k = 0 asked, or k = 4 with a draft that proposed nothing
        assert count_emitted(draftless(k), 1).next_kind == TARGET


def test_the_stats_count_no_bonus_for_draftless_rounds():
    stats = StatsCollector()
    for _ in range(3):
        stats.add_round(draftless(0), 1)
    proto = stats.proto()
    assert (proto.bonus_tokens, proto.recovered_tokens, proto.draft_tokens) == (0, 0, 0)


def test_trace_table_and_json_say_target():
    stats = StatsCollector()
    o = draftless(0)
    row = stats.round_proto(o, stats.add_round(o, 1), text=" c")
    assert row.next_kind == TARGET and row.next_token == 11
    assert "11 (target)" in round_table([row]) and "bonus" not in round_table([row])
    assert message_to_dict(row)["next_kind"] == "NEXT_KIND_TARGET"
