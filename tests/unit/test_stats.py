"""orchestrator/stats.py: a round counts only what it emitted (EOS / length / stop cuts)."""

from __future__ import annotations

import pytest

from orchestrator.rounds import RoundOutcome
from orchestrator.stats import StatsCollector, count_emitted
from specdec.v1 import target_pb2

RECOVERED, BONUS, NONE = target_pb2.NEXT_KIND_RECOVERED, target_pb2.NEXT_KIND_BONUS, target_pb2.NEXT_KIND_UNSPECIFIED
EOS = 2


def outcome(draft: list[int], accepted: int, next_token: int, kind: int) -> RoundOutcome:
    target = draft[:accepted] + [next_token]
    return RoundOutcome(
        k=len(draft),
        draft_ids=draft,
        matches=[i < accepted for i in range(len(draft))],
        target_ids=target,
        num_accepted=accepted,
        next_token=next_token,
        next_kind=kind,
        emitted=target,
    )


@pytest.mark.parametrize(
    "kept,want",
    [
        (5, (5, 4, 4, BONUS)),  # nothing cut: all 4 accepted plus the bonus token
        (2, (2, 2, 2, NONE)),  # EOS at position 1: positions 2, 3 and the bonus token were never emitted
        (4, (4, 4, 4, NONE)),  # cut just before the bonus token
        (0, (0, 0, 0, NONE)),  # a stop string removed the whole round
    ],
)
def test_a_cut_inside_an_accepted_run_drops_what_follows(kept, want):
    e = count_emitted(outcome([7, EOS, 8, 9], 4, 10, BONUS), kept)
    assert (e.tokens, e.drafted, e.accepted, e.next_kind) == want


def test_a_rejected_round_counts_every_drafted_position():
    e = count_emitted(outcome([7, 8, 9], 1, 5, RECOVERED), 2)
    assert (e.tokens, e.drafted, e.accepted, e.next_kind) == (2, 3, 1, RECOVERED)


def test_the_stats_sum_to_the_completion_and_the_rate_follows():
    stats = StatsCollector()
    rounds = [(outcome([7, 8, 9], 1, 5, RECOVERED), 2), (outcome([7, EOS, 8, 9], 4, 10, BONUS), 2)]
    for o, kept in rounds:
        stats.add_round(o, kept)
    proto = stats.proto()
    assert (proto.draft_tokens, proto.accepted_tokens, proto.recovered_tokens, proto.bonus_tokens) == (5, 3, 1, 0)
    assert proto.acceptance_rate == pytest.approx(3 / 5)
    assert proto.mean_accepted_length == pytest.approx((2 + 2) / 2)
    assert list(proto.accepted_per_position) == [2, 1, 0] and list(proto.drafted_per_position) == [2, 2, 1]
    row = stats.round_proto(rounds[1][0], count_emitted(*rounds[1]), text="x")
    assert (row.num_accepted, row.next_kind, row.next_token) == (2, NONE, -1)
    assert list(row.draft_ids) == [7, EOS] and list(row.matches) == [True, True] and list(row.target_ids) == [7, EOS]
    row = stats.round_proto(rounds[0][0], count_emitted(*rounds[0]), text="x")
    assert list(row.draft_ids) == [7, 8, 9] and list(row.target_ids) == [7, 5] and row.next_kind == RECOVERED
