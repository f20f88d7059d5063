"""specdec.report.round_table: the per-round table the CLI's --trace and `make demo` print."""

from __future__ import annotations

from specdec.report import round_table
from specdec.v1 import orchestrator_pb2 as pb
from specdec.v1 import target_pb2


def test_each_round_shows_its_tokens_verdict_and_where_its_time_went():
    rounds = [
        pb.Round(
            index=0,
            k=4,
            draft_kind="ngram",
            draft_ids=[5, 6, 7, 8],
            matches=[True, True, False, False],
            target_ids=[5, 6, 9],
            num_accepted=2,
            next_token=9,
            next_kind=target_pb2.NEXT_KIND_RECOVERED,
            text=" a b",
            draft_ms=0.07,
            target_ms=88.6,
            overhead_ms=1.06,
            target_service_ms=89.3,
        ),
        pb.Round(
            index=1,
            k=0,
            target_ids=[3],
            next_token=3,
            next_kind=target_pb2.NEXT_KIND_TARGET,
            text=" c",
            target_ms=49.1,
            overhead_ms=0.83,
        ),  # a target that reports no service time
        pb.Round(
            index=2,
            k=2,
            draft_kind="model",
            draft_ids=[1, 2],
            matches=[True],
            target_ids=[1],
            num_accepted=1,
            next_token=-1,
            text=".",
            draft_ms=6.0,
            target_ms=60.0,
            overhead_ms=3.1,
            target_service_ms=60.7,
            draft_service_ms=7.0,
        ),  # cut by a stop inside the round
    ]
    header, rule, first, second, third = round_table(rounds).splitlines()
    assert header.endswith("draft  target other (target)  text")
    assert len(rule) == len(header)
    assert "[5, 6, 7, 8]" in first and "[T,T,F,F]" in first and "9 (recovered)" in first
    assert "0.1    88.6 1.06 (0.70)" in first and first.endswith("' a b'")
    assert "3 (target)" in second and "0.0    49.1 0.83 " in second and "(" not in second.split("0.83")[1]
    assert "- (cut)" in third and "6.0    60.0 3.10 (0.70)" in third
