"""Branches of overlapped rounds (orchestrator/overlap.py, docs/overlap.md "Branches"): besides the post-verify
block, a round drafts ahead behind the draft's runner-up token at a position of its block, used when the target
rejects the draft there and recovers with that token. The draft reports its runner-up per position
(ModelDraft.runner_up), the planner orders the branches by their chance and what they cost, and a round takes
the one block whose context is the accepted one."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import torch

from orchestrator.adaptive import CostModel
from orchestrator.overlap import (
    AheadPlan,
    BlockBase,
    Branch,
    RunnerUpTracker,
    branch_chances,
    plan_ahead,
    ready_block,
    start_predraft,
    take,
    usable_block,
)
from specdec.config import OverlapConfig
from specdec.core.sampling import SamplingConfig
from specdec.engine.draft import ModelDraft
from specdec.engine.types import ProposeInput
from specdec.errors import Unavailable
from specdec.v1 import draft_pb2
from tests.support import tiny_llama
from tests.unit.test_prefix_sharing import runner_for

CONTEXT = [5, 6, 7]
BLOCK = [1, 2]  # round r's drafts d1 d2
RUNNER_UPS = [3, 4]  # the draft's runner-up at positions 1 and 2
COSTS = dict(verify_ms={1: 56.0, 3: 57.0}, draft_step_ms={"model": 5.7}, overhead_ms={"": 1.0, "model": 3.0})


def _response(ids, runner_ups=()):
    response = draft_pb2.ProposeResponse(draft_ids=ids, draft_kind="model", runner_up_ids=list(runner_ups))
    response.stats.forward_ms = 6.0
    return response


async def _answer(response, delay_s=0.0, log=None, name=""):
    if log is not None:
        log.append(name)
    await asyncio.sleep(delay_s)
    return response, "draft-0", 0


def _branches(log, delay_s=0.0, fail_first=False):
    """Round r + 1's candidates after round r (context 5 6 7, block 1 2, runner-ups 3 4): behind r1 = 3, behind
    d1 r2 = 1 4, and post-verify behind 1 2 (guess 9)."""

    async def failing():
        log.append("r1")
        raise Unavailable("the draft went away")

    first = failing if fail_first else (lambda: _answer(_response([20, 21], [30, 31]), delay_s, log, "r1"))
    return [
        Branch(BlockBase.of(CONTEXT, []), 3, first),
        Branch(BlockBase.of(CONTEXT, [1]), 4, lambda: _answer(_response([22, 23]), delay_s, log, "r2")),
        Branch(BlockBase.of(CONTEXT, BLOCK), None, lambda: _answer(_response([9, 24, 25]), delay_s, log, "post")),
    ]


@pytest.mark.parametrize(
    "context,k,want",
    [
        (CONTEXT + [3], 2, 2),  # d1 rejected, the target recovered with the runner-up: the whole block
        (CONTEXT + [3], 1, 1),  # the next round asks fewer
        (CONTEXT + [8], 2, 0),  # recovered with another token
        (CONTEXT + [1, 3], 2, 0),  # a longer context
    ],
)
def test_a_branch_block_is_usable_only_from_its_own_context(context, k, want):
    assert usable_block(BlockBase.of(CONTEXT, []), [20, 21], context, k, guess=3) == want


def test_branch_chances_order_recoveries_by_the_runner_up_and_the_post_verify_guess():
    chances = dict(branch_chances([0.4, 0.2], 2, 0.25))
    assert chances[1] == pytest.approx(0.6 * 0.25)  # d1 rejected, r1 right
    assert chances[2] == pytest.approx(0.4 * 0.8 * 0.25)  # d1 accepted, d2 rejected, r2 right
    assert chances[3] == pytest.approx(0.4 * 0.2 * 0.2)  # all accepted, the bonus guessed (PEARL)
    assert [i for i, _ in branch_chances([0.4, 0.2], 2, 0.25)] == [1, 2, 3]
    assert [i for i, _ in branch_chances([0.9, 0.9], 2, 0.25)][0] == 3  # high acceptance: post-verify first
    assert branch_chances([0.5], 0, 0.25) == [(1, 0.5)]  # a k = 0 round: the next token guessed


def test_plan_ahead_drafts_behind_runner_ups_where_the_post_verify_block_would_not_pay():
    costs, rates = CostModel(**COSTS), [0.37, 0.18]
    assert plan_ahead(2, 2, costs, OverlapConfig(branches=0), rates, runner_up_rate=0.25).k == 0
    plan = plan_ahead(2, 2, costs, OverlapConfig(branches=2), rates, runner_up_rate=0.25)
    assert plan.k == 2 and plan.at[0] == 1 and 3 not in plan.at and plan.wants_runner_up(2)
    assert plan_ahead(2, 2, costs, OverlapConfig(branches=1), rates, runner_up_rate=0.25).at == (1,)
    assert plan_ahead(2, 2, costs, OverlapConfig(branches=2), rates, runner_up_rate=0.0).k == 0
    slow = CostModel(**{**COSTS, "verify_ms": {1: 20.0, 3: 21.0}})  # a short verify: only the first fits
    assert plan_ahead(2, 2, slow, OverlapConfig(branches=2), rates, runner_up_rate=0.25).at == (1,)
    assert not AheadPlan(2, (3,)).wants_runner_up(2) and AheadPlan(2, (1, 3)).wants_runner_up(2)


def test_the_runner_up_tracker_counts_recoveries_only():
    tracker = RunnerUpTracker(hits=0.0, tries=0.0)
    tracker.observe([1, 2], [3, 4], 0, 3)  # d1 rejected, recovered with r1: a hit
    tracker.observe([1, 2], [3, 4], 1, 8)  # d2 rejected, recovered with another token: a miss
    tracker.observe([1, 2], [3, 4], 2, 5)  # all accepted: the bonus is no recovery
    tracker.observe([1, 2], [], 0, 3)  # no runner-ups asked
    assert tracker.tries == pytest.approx(0.9 + 1.0) and tracker.hits == pytest.approx(0.9)
    assert 0.0 < RunnerUpTracker().rate() < 1.0


def test_a_round_takes_the_branch_of_its_context_and_stops_the_rest():
    async def scenario():
        log = []
        ahead = start_predraft(_branches(log, delay_s=0.01), "model")
        await asyncio.sleep(0.005)
        ahead.verified = time.perf_counter()
        taken = await take(ahead, CONTEXT + [3], 2, "model")  # d1 rejected, recovered with r1
        return taken, log, ahead

    taken, log, ahead = asyncio.run(scenario())
    assert list(taken.response.draft_ids) == [20, 21] and list(taken.response.runner_up_ids) == [30, 31]
    assert taken.runner_up_at == 1 and taken.hidden_ms > 0
    assert log == ["r1"] and ahead.task.done()  # the later branches never ran


def test_a_round_waits_for_a_later_branch_and_ready_block_sees_it_only_when_answered():
    async def scenario():
        log = []
        ahead = start_predraft(_branches(log), "model")
        before = ready_block(ahead, CONTEXT + BLOCK + [9], 3)
        await asyncio.sleep(0.01)
        after = ready_block(ahead, CONTEXT + BLOCK + [9], 3), ready_block(ahead, CONTEXT + [1, 4], 3)
        taken = await take(ahead, CONTEXT + BLOCK + [9], 3, "model")  # all accepted, bonus guessed
        return before, after, taken, log

    before, after, taken, log = asyncio.run(scenario())
    assert before == 0 and after == (2, 2)
    assert list(taken.response.draft_ids) == [24, 25] and taken.runner_up_at == 0
    assert log == ["r1", "r2", "post"]


def test_a_failed_branch_ends_the_pre_draft_and_costs_no_token():
    async def scenario():
        log = []
        ahead = start_predraft(_branches(log, fail_first=True), "model")
        return await take(ahead, CONTEXT + [1, 4], 2, "model"), log

    taken, log = asyncio.run(scenario())
    assert taken is None and log == ["r1"]


@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.8, top_p=0.9, seed=7, repetition_penalty=1.3)],
)
def test_the_draft_reports_its_likeliest_other_token_per_position(sampling):
    draft = ModelDraft(runner_for(tiny_llama(), share_min_tokens=0), max_context=512, eos_ids=[])
    ids = [random.Random(3).randrange(4, 64) for _ in range(12)]
    plain = draft.propose(ProposeInput("a", ids, 3, sampling))
    asked = draft.propose(ProposeInput("b", ids, 3, sampling, runner_up=True))
    assert asked.draft_ids == plain.draft_ids and plain.runner_up_ids == []  # asking changes no draft token
    assert len(asked.runner_up_ids) == 3
    context = list(ids)
    for token, other in zip(asked.draft_ids, asked.runner_up_ids):
        logits = draft.runner.model(input_ids=torch.tensor([context])).logits[0, -1].float()
        if sampling.repetition_penalty == 1.0:
            top = torch.topk(logits, 2).indices.tolist()
            assert other == (top[1] if top[0] == token else top[0])
        assert other != token
        context.append(token)


def test_a_request_sets_its_branches_within_the_k_limit():
    from specdec.config import Limits
    from specdec.errors import InvalidArgument
    from specdec.params import resolve_generation
    from specdec.v1 import orchestrator_pb2 as pb

    limits = Limits()
    assert resolve_generation(pb.GenerateRequest(prompt="x", max_new_tokens=4), limits).overlap_branches is None
    req = pb.GenerateRequest(prompt="x", max_new_tokens=4, overlap=True, overlap_branches=0)
    assert resolve_generation(req, limits).overlap_branches == 0
    with pytest.raises(InvalidArgument, match="overlap_branches must be in"):
        resolve_generation(pb.GenerateRequest(prompt="x", max_new_tokens=4, overlap_branches=limits.max_k + 1), limits)
    costs, rates = CostModel(**COSTS), [0.37, 0.18]
    assert plan_ahead(2, 2, costs, OverlapConfig(branches=2), rates, runner_up_rate=0.25, branches=0).k == 0
    assert plan_ahead(2, 2, costs, OverlapConfig(branches=0), rates, runner_up_rate=0.25, branches=1).at == (1,)
