"""Prefix sharing: a new session starts from the longest prefix another cached session holds (copied), with
the logits a whole forward gives; never past `first`, never below share_min_tokens, never a shared buffer."""

from __future__ import annotations

import random

import pytest
import torch

from specdec.engine.kvcache import KVCachePool, common_prefix_len, kv_bytes_per_token
from specdec.engine.runner import ExtendItem
from specdec.engine.torch_runner import CausalLMRunner
from tests.support import full_logits, tiny_llama

SYSTEM = [7, 3, 9, 12, 5, 5, 1, 30, 31, 2, 8, 8, 14, 60, 61, 17, 4, 4, 22, 23]  # a shared "system prompt"


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def runner_for(model, share_min_tokens=4, budget_tokens=10_000, **kwargs):
    per_token = kv_bytes_per_token(model.config, 4)
    pool = KVCachePool(budget_tokens * per_token, per_token, model.config, share_min_tokens=share_min_tokens)
    return CausalLMRunner(model, pool, **kwargs)


def test_a_new_session_starts_from_another_sessions_prefix_with_the_same_logits(model):
    runner = runner_for(model)
    runner.extend("turn1", SYSTEM + [40, 41, 42], first=22)
    ids = SYSTEM + [40, 41, 50, 51]  # shares SYSTEM + [40, 41]: 22 tokens
    out = runner.extend("turn2", ids, first=len(ids) - 1)
    assert (out.cached_tokens, out.computed_tokens) == (22, 2)
    torch.testing.assert_close(out.logits, full_logits(model, ids)[-1:], atol=1e-4, rtol=1e-4)
    c = runner.pool.counters
    assert (c.prefix_hits, c.prefix_shared_tokens, c.reused_tokens) == (1, 22, 22)


def test_a_call_that_would_copy_a_long_prefix_does_not_count_as_small(model):
    # `uncached` (what the forward computes) is 2 here, but the forward first copies 22 positions from "turn1":
    # at 6,700 tokens such a copy takes 0.1 s, so what decides running inline (`lent=False`) counts copies too
    runner = runner_for(model)
    runner.extend("turn1", SYSTEM + [40, 41, 42], first=22)
    ids = SYSTEM + [40, 41, 50, 51]
    pool = runner.pool
    assert (pool.uncached("turn2", ids), pool.uncached("turn2", ids, lent=False)) == (2, 24)
    runner.extend("turn2", ids, first=len(ids) - 1)
    grown = ids + [52, 53]
    assert pool.uncached("turn2", grown) == pool.uncached("turn2", grown, lent=False) == 2  # its own cache
    assert pool.uncached("fresh", [90, 91, 92], lent=False) == 3  # nothing to share


def test_sharing_stops_at_first_so_the_asked_rows_are_computed(model):
    runner = runner_for(model)
    runner.extend("a", SYSTEM + [40, 41, 42], first=22)
    ids = SYSTEM + [40, 41, 42]  # the same prompt again
    out = runner.extend("b", ids, first=15)
    assert (out.cached_tokens, out.computed_tokens) == (15, 8)
    torch.testing.assert_close(out.logits, full_logits(model, ids)[15:], atol=1e-4, rtol=1e-4)


def test_nothing_is_shared_below_the_minimum_or_when_off(model):
    for share_min_tokens, prompt in ((30, SYSTEM + [40]), (0, SYSTEM + [40])):
        runner = runner_for(model, share_min_tokens=share_min_tokens)
        runner.extend("a", SYSTEM + [50, 51], first=21)
        out = runner.extend("b", prompt, first=len(prompt) - 1)
        assert out.cached_tokens == 0 and runner.pool.counters.prefix_hits == 0


def test_the_copy_is_the_sessions_own_the_donor_rolling_back_and_rewriting_leaves_it_alone(model):
    runner = runner_for(model)
    runner.extend("a", SYSTEM + [40, 41, 42], first=22)
    b_ids = SYSTEM + [40, 41, 42, 43]
    runner.extend("b", b_ids, first=len(b_ids) - 1)
    runner.extend("a", SYSTEM[:10] + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], first=10)  # a rewrites its cache
    b_ids = b_ids + [44, 45]
    out = runner.extend("b", b_ids, first=len(b_ids) - 2)
    assert out.cached_tokens == 24
    torch.testing.assert_close(out.logits, full_logits(model, b_ids)[-2:], atol=1e-4, rtol=1e-4)


def test_the_longest_sharer_is_chosen_and_an_evicted_one_is_gone(model):
    runner = runner_for(model, budget_tokens=80)
    runner.extend("short", SYSTEM + [40], first=20)
    runner.extend("long", SYSTEM + [40, 41, 42, 43], first=23)
    out = runner.extend("new", SYSTEM + [40, 41, 42, 50], first=23)
    assert out.cached_tokens == 23
    pool = runner.pool
    assert pool.uncached("next", SYSTEM + [40, 41, 42, 43, 44]) == 1  # the work estimate counts the sharer
    pool.release("long"), pool.release("new")
    assert pool.uncached("next", SYSTEM + [40, 41, 42, 43, 44]) == 4  # only "short" left: 21 shared
    runner.extend("big", list(range(1, 61)), first=59)  # evicts "short" (80-token budget)
    assert pool.uncached("next", SYSTEM + [40, 41]) == 22


def test_batched_new_sessions_share_with_a_cached_one(model):
    runner = runner_for(model, batching=True)
    runner.extend("a", SYSTEM + [40, 41], first=21)
    b, c = SYSTEM + [50, 51, 52], SYSTEM + [40, 41, 60]
    outs = runner.extend_batch([ExtendItem("b", b, len(b) - 1), ExtendItem("c", c, len(c) - 1)])
    assert [o.cached_tokens for o in outs] == [20, 22]
    torch.testing.assert_close(outs[0].logits, full_logits(model, b)[-1:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(outs[1].logits, full_logits(model, c)[-1:], atol=1e-4, rtol=1e-4)


def test_a_session_keeping_hidden_rows_shares_only_with_one_that_kept_them_and_gets_them(model):
    runner = runner_for(model, keep_hidden=True)
    runner.extend_batch([ExtendItem("plain", SYSTEM + [40, 41], 21, hidden=False)])
    feature = SYSTEM + [40, 41, 42]
    out = runner.extend_batch([ExtendItem("f1", feature, len(feature) - 1, hidden=True)])[0]
    assert out.cached_tokens == 0  # "plain" kept no hidden rows: not a donor
    out = runner.extend_batch([ExtendItem("f2", feature + [43], len(feature), hidden=True)])[0]
    assert out.cached_tokens == len(feature)
    f1, f2 = runner.pool._sessions["f1"], runner.pool._sessions["f2"]
    torch.testing.assert_close(f2.hidden[: len(feature)], f1.hidden[: len(feature)])
    assert f2.hidden.shape[0] == len(feature) + 1


def test_common_prefix_len_bisects_to_the_first_difference():
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 300))]
        b = (
            list(a)
            if rng.random() < 0.2
            else a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 50))]
        )
        naive = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix_len(a, b) == naive


def test_both_model_services_size_a_call_by_what_it_writes_to_its_cache(model):
    """The wiring of the rule above: the target's batch queue and the draft's inline check count copies."""
    from draft_service.servicer import small_call
    from specdec.core.sampling import SamplingConfig
    from specdec.engine.draft import ModelDraft
    from specdec.engine.loading import ModelBundle
    from specdec.engine.target import TargetEngine
    from specdec.engine.types import ProposeInput, VerifyInput
    from target_service.servicer import TargetServicer

    runner = runner_for(model)
    runner.extend("turn1", SYSTEM + [40, 41, 42], first=22)
    greedy = SamplingConfig(temperature=0.0)
    target = TargetEngine(runner, max_context=512, max_k=8)
    servicer = TargetServicer()
    servicer.bundle = ModelBundle("target", "tiny", {"target": target}, "target", {}, runner.pool, inline_max_tokens=16)
    shares = VerifyInput("turn2", SYSTEM + [40, 41, 50], [51], greedy)  # computes 2, copies 22
    fresh = VerifyInput("other", [90, 91, 92], [93], greedy)
    queue = servicer.batches()
    assert target.work_tokens(shares) == 2 and not queue._small_items([shares]) and queue._small_items([fresh])
    draft = ModelDraft(runner, max_context=512, eos_ids=[])
    assert not small_call(draft, ProposeInput("turn3", SYSTEM + [40, 41, 60], 2, greedy), 16)
    assert small_call(draft, ProposeInput("new", [90, 91, 92], 2, greedy), 16)
