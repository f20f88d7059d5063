"""The pure pieces of overlapped rounds (orchestrator/overlap.py): when a block drafted ahead is usable,
what adaptive k weighs, taking and discarding a pre-draft, the delta-round bookkeeping of a call sent
ahead (orchestrator/delta.py), and the test-only hop delay."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.delta import ContextWire
from orchestrator.overlap import (
    AheadCosts,
    BlockBase,
    Branch,
    discard,
    hit_probability,
    start_predraft,
    take,
    usable_block,
    with_hop_delay,
    worth_overlapping,
)
from specdec.errors import Unavailable
from specdec.v1 import common_pb2, draft_pb2

BASE_IDS = [5, 6, 7, 1, 2]  # round r's context [5, 6, 7] + its block d1 d2 = [1, 2]
BASE = BlockBase.of([5, 6, 7], [1, 2])
DRAFTED = [9, 10, 11, 12]  # e1 (the guess of the bonus), then the next block e2 e3 e4


@pytest.mark.parametrize(
    "context,k,want",
    [
        (BASE_IDS + [9], 3, 3),  # all accepted, bonus = the guess: the whole block
        (BASE_IDS + [9], 2, 2),  # the next round asks fewer: the first tokens (position-keyed draws)
        (BASE_IDS + [9], 5, 3),  # asks more than drafted: what there is
        (BASE_IDS + [8], 3, 0),  # the bonus was not the guess
        ([5, 6, 7, 1, 4], 3, 0),  # d2 rejected, recovered 4
        ([5, 6, 7, 3], 3, 0),  # d1 rejected: a shorter context
        (BASE_IDS + [9, 10], 3, 0),  # a longer context
        ([5, 6, 0, 1, 2, 9], 3, 0),  # same length and tail, another prefix
        (BASE_IDS + [9], 0, 0),  # the next round drafts nothing
    ],
)
def test_usable_block(context, k, want):
    assert usable_block(BASE, DRAFTED, context, k) == want


def test_a_pre_draft_of_the_guess_alone_is_never_usable():
    assert usable_block(BASE, [9], BASE_IDS + [9], 3) == 0


def test_hit_probability_is_all_accepted_times_the_guess():
    rates = [0.5, 0.4, 0.3]
    assert hit_probability(rates, 1) == pytest.approx(0.5 * 0.4)
    assert hit_probability(rates, 2) == pytest.approx(0.5 * 0.4 * 0.3)
    assert hit_probability(rates, 4) == pytest.approx(0.5 * 0.4 * 0.3 * 0.3 * 0.3)  # past the end: deepest rate
    assert hit_probability([], 2) == 0.0


def test_worth_overlapping_weighs_saving_against_misses_and_waiting():
    cpu = AheadCosts(draft_step_ms=2.75, draft_hop_ms=3.0, verify_ms=33.0, miss_cost_ms=1.0)
    assert worth_overlapping(0.3, 4, cpu)  # 0.3 x 14 ms saved > 1 ms
    assert not worth_overlapping(0.01, 4, cpu)  # open prompts at k = 4: ~never used
    slow_draft = AheadCosts(draft_step_ms=20.0, draft_hop_ms=3.0, verify_ms=33.0, miss_cost_ms=1.0)
    assert not worth_overlapping(0.1, 4, slow_draft)  # 103 ms of pre-draft behind a 33 ms verify: the wait dominates
    assert not worth_overlapping(1.0, 0, cpu)
    contended = AheadCosts(draft_step_ms=2.75, draft_hop_ms=3.0, verify_ms=33.0, miss_cost_ms=24.0)
    assert not worth_overlapping(0.3, 4, contended)  # a verify 24 ms slower beside a pre-draft (measured under load)


def _response(ids, rows=True):
    response = draft_pb2.ProposeResponse(draft_ids=ids, draft_kind="model")
    if rows:
        for t in ids:
            response.draft_probs.add(token_ids=[t], probs=[1.0])
    response.stats.forward_ms = 7.0
    return response


async def _answer(response, delay_s=0.0):
    await asyncio.sleep(delay_s)
    return response, "draft-0", 0


def test_take_slices_the_block_after_the_guess_and_reports_hidden_time():
    async def scenario():
        ahead = start_predraft([Branch(BASE, None, lambda: _answer(_response(DRAFTED)))], "model")
        await asyncio.sleep(0.01)
        ahead.verified = time.perf_counter()
        return await take(ahead, BASE_IDS + [9], 2, "model")

    taken = asyncio.run(scenario())
    assert list(taken.response.draft_ids) == [10, 11]
    assert [list(r.token_ids) for r in taken.response.draft_probs] == [[10], [11]]
    assert taken.replica == "draft-0" and taken.forward_ms == 7.0 and taken.hidden_ms > 0


def test_take_discards_another_context_or_kind_and_cancels_a_running_pre_draft():
    async def scenario(context, kind):
        ahead = start_predraft([Branch(BASE, None, lambda: _answer(_response(DRAFTED), delay_s=10))], "model")
        got = await take(ahead, context, 3, kind)
        return got, ahead.task.cancelled()

    assert asyncio.run(scenario(BASE_IDS[:-1] + [4], "model")) == (None, True)
    assert asyncio.run(scenario(BASE_IDS + [9], "")) == (None, True)  # the next round's draft is not the model


def test_a_failed_pre_draft_costs_time_never_a_token():
    async def failing():
        raise Unavailable("the draft went away")

    async def scenario():
        ahead = start_predraft([Branch(BASE, None, failing)], "model")
        return await take(ahead, BASE_IDS + [9], 3, "model")

    assert asyncio.run(scenario()) is None


def test_discard_waits_for_a_cancelled_pre_draft():
    async def scenario():
        ahead = start_predraft([Branch(BASE, None, lambda: _answer(_response(DRAFTED), delay_s=10))], "model")
        await discard(ahead)
        await discard(None)
        return ahead.task.done()

    assert asyncio.run(scenario())


def test_a_call_sent_ahead_confirms_only_the_accepted_context():
    wire = ContextWire()
    info = common_pb2.ModelInfo(context_delta=True)
    real = wire.send("draft", [5, 6, 7])
    real.confirm("a")
    ahead = wire.send_ahead("draft", [5, 6, 7], [1, 2])
    request = draft_pb2.ProposeRequest()
    ahead.fill(request, "a", info)
    assert request.position_base == 3 and list(request.context_ids) == [1, 2]
    ahead.confirm("a")
    assert wire.held[("draft", "a")] == 3  # the block may be rejected: not claimed as held
    nxt = wire.send("draft", [5, 6, 7, 4])  # d1 rejected, recovered 4
    nxt.fill(request, "a", info)
    assert request.position_base == 3 and list(request.context_ids) == [4]
    assert request.prefix_hash == wire.hashes.at(3)


def test_hop_delay_delays_both_hops():
    async def scenario():
        start = time.perf_counter()
        result = await with_hop_delay(15.0, lambda: asyncio.sleep(0, result="ok"))
        return result, time.perf_counter() - start

    result, took = asyncio.run(scenario())
    assert result == "ok" and took >= 0.030


def test_a_usable_block_drafted_ahead_is_free_and_accepted_from_position_two():
    from orchestrator.adaptive import AcceptanceTracker, CostModel, choose_k, choose_k_drafted

    costs = CostModel(verify_ms={1: 26.0, 5: 33.0}, draft_step_ms={"model": 2.75}, overhead_ms={"": 2.0, "model": 5.0})
    tracker = AcceptanceTracker(k_max=4)
    for _ in range(40):  # position 1 accepted 1 in 5 rounds; past it, 3 in 5
        for accepted in (0, 0, 0, 0, 3):
            tracker.observe(4, accepted)
    assert choose_k(costs, tracker, 4, "model") == 0  # drafting and verifying 4 tokens does not pay
    assert choose_k_drafted(costs, tracker, 4, "model") >= 3  # a free block accepted ~0.6 a position does


def test_a_block_base_compares_the_block_and_a_few_prefix_tokens_not_the_whole_context():
    long_context = list(range(10_000))
    base = BlockBase.of(long_context, [7, 8])
    assert len(base) == 10_002 and base.prefix_tail == tuple(range(9_992, 10_000))
    assert base.continued_by_one(long_context + [7, 8, 1])
    assert not base.continued_by_one(long_context + [7, 9, 1])  # another block
    assert not base.continued_by_one(long_context + [7, 8])  # one short
    assert not base.continued_by_one(long_context[:-1] + [0, 7, 8, 1])  # the guard: round r's last token differs
    assert BlockBase.of([], [3]).continued_by_one([3, 4])  # an empty prefix


def test_adaptive_k_drafts_ahead_only_what_a_round_would_verify_from_a_free_block():
    """A block drafted ahead pays only if a round verifies it; where a target pass costs much more per row
    (this box at 1 thread: v(2) = 1.7 v(1)) a free block at these rates is not worth its verify, so adaptive
    k does not draft ahead at all; fixed k still does (its next round verifies k tokens anyway)."""
    from orchestrator.adaptive import AcceptanceTracker, CostModel
    from orchestrator.overlap import plan_ahead
    from specdec.config import OverlapConfig

    tracker = AcceptanceTracker(k_max=4)
    for _ in range(40):  # rates ~ [0.46, 0.51, 0.23, 0.23]
        for accepted in (0, 0, 0, 1, 2):
            tracker.observe(4, accepted)
    draft = {"draft_step_ms": {"model": 2.75}, "overhead_ms": {"": 2.0, "model": 5.0}}
    flat = CostModel(verify_ms={1: 26.0, 5: 33.0}, **draft)
    steep = CostModel(verify_ms={1: 56.0, 2: 96.0, 5: 124.0}, **draft)
    rates, cfg = tracker.rates(), OverlapConfig()
    assert plan_ahead(4, 0, flat, cfg, rates, adaptive=True).k == 2  # not 4: tokens 3 and 4 would go unused
    assert plan_ahead(4, 0, steep, cfg, rates, adaptive=True).k == 0
    assert plan_ahead(4, 0, steep, cfg, rates, adaptive=False).k == 4


def test_drafting_ahead_stops_at_once_when_other_generations_run_here():
    """The averaged batch learns load only after some rounds; the count of generations running in this
    orchestrator says it now: with another one running, their rounds share the target's passes."""
    from orchestrator.adaptive import CostModel
    from orchestrator.overlap import plan_ahead
    from specdec.config import OverlapConfig

    costs = CostModel(verify_ms={1: 26.0, 5: 33.0}, draft_step_ms={"model": 2.75}, overhead_ms={"": 2.0, "model": 5.0})
    rates, cfg = [0.6, 0.6, 0.6, 0.6], OverlapConfig(max_running=1)
    assert plan_ahead(4, 4, costs, cfg, rates, running=1).k == 4  # alone: drafts ahead
    assert plan_ahead(4, 4, costs, cfg, rates, running=2).k == 0  # another generation runs
    assert plan_ahead(4, 4, costs, OverlapConfig(max_running=4), rates, running=2).k == 4
    costs.batch = 2.0  # passes shared on average
    assert plan_ahead(4, 4, costs, cfg, rates, running=1).k == 0
