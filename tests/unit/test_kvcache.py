"""KV caches: explicit truncation, reuse of the longest common prefix, LRU budget, O(n) compute."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specdec.engine.growing_layer import GrowingLayer, new_session_cache
from specdec.engine.kvcache import (
    IdleRule,
    KVCachePool,
    SessionKV,
    UnsupportedCacheError,
    common_prefix_len,
    kv_bytes_per_token,
)
from specdec.engine.runner import ExtendItem
from specdec.engine.torch_runner import CausalLMRunner
from specdec.errors import ResourceExhausted
from tests.support import TINY_LLAMA_VOCAB, full_logits, tiny_llama

VOCAB = TINY_LLAMA_VOCAB


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def runner_for(model, budget_tokens=10_000):
    per_token = kv_bytes_per_token(model.config, 4)
    return CausalLMRunner(model, KVCachePool(budget_tokens * per_token, per_token, model.config))


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len((1, 2, 3), [1, 2, 3, 4]) == 3  # a tuple against a list
    assert common_prefix_len([5] * 400, [5] * 399 + [6]) == 399


def test_bytes_per_token_counts_keys_and_values(model):
    # 2 (K and V) x 2 layers x 2 kv heads x head_dim 8 x 4 bytes
    assert kv_bytes_per_token(model.config, 4) == 2 * 2 * 2 * 8 * 4


def test_reuse_and_rollback_give_the_same_logits_as_a_full_forward(model):
    runner = runner_for(model)
    ids = list(range(1, 21))
    first = runner.extend("s", ids, first=len(ids) - 1)
    assert first.computed_tokens == 20 and first.cached_tokens == 0
    # a "rejected draft": roll back 5 tokens and go another way
    branch = ids[:15] + [40, 41, 42]
    again = runner.extend("s", branch, first=14)
    assert again.cached_tokens == 14 and again.rolled_back == 6 and again.computed_tokens == 4
    torch.testing.assert_close(again.logits, full_logits(model, branch)[14:], atol=1e-4, rtol=1e-4)
    assert runner.pool.counters.rollbacks == 1


def test_computed_tokens_are_linear_in_length_not_rounds(model):
    runner = runner_for(model)
    ids = [3, 4, 5]
    for step in range(60):  # a decode loop: each call adds 2 tokens, one of which is later rolled back
        ids = ids + [step % VOCAB, (step * 7) % VOCAB]
        runner.extend("s", ids, first=len(ids) - 2)
        ids = ids[:-1]
    assert runner.pool.counters.computed_tokens <= 3 + 2 * 60 + 60  # O(total length), not O(rounds x length)


def test_a_dropped_cache_is_rebuilt_with_the_same_logits(model):
    runner = runner_for(model)
    ids = list(range(5, 30))
    a = runner.extend("s", ids, first=20).logits
    assert runner.pool.release("s")
    b = runner.extend("s", ids, first=20)
    assert b.cached_tokens == 0
    torch.testing.assert_close(a, b.logits)


def test_lru_eviction_keeps_the_budget(model):
    runner = runner_for(model, budget_tokens=50)
    for s in range(5):
        runner.extend(f"s{s}", list(range(1, 21)), first=19)
        assert runner.pool.used_bytes() <= runner.pool.budget_bytes
    assert runner.pool.counters.evictions >= 3
    assert runner.pool.session_count() <= 2


def test_an_evicted_session_that_comes_back_counts_as_a_reprefill_and_one_that_does_not_costs_nothing():
    pool = KVCachePool(budget_bytes=50, bytes_per_token=1)
    for sid, tokens in (("a", 20), ("b", 20)):
        pool.acquire(sid, tokens).tokens.extend(range(tokens))
    pool.acquire("c", 20)  # a is least recently used: evicted
    assert (pool.counters.evictions, pool.counters.evicted_tokens, pool.counters.reprefills) == (1, 20, 0)
    pool.acquire("a", 25)  # a comes back: it prefills again; b goes
    assert (pool.counters.reprefills, pool.counters.reprefill_tokens) == (1, 20)
    pool.release("b")  # b was evicted, then deleted: no return to count
    pool.acquire("b", 5)
    assert (pool.counters.evictions, pool.counters.reprefills) == (2, 1)


def test_idle_sessions_beyond_the_idle_tokens_are_evicted_least_recently_used_first(monkeypatch):
    """The idle rule (llama.cpp's unified cache, whose every decode spans all held cells): sessions unused for
    `seconds` hold at most `tokens` positions; the oldest go first, a session in use is never idle, and one
    that comes back prefills again (counted)."""
    from specdec.engine import kvcache

    clock = [100.0]
    monkeypatch.setattr(kvcache.time, "monotonic", lambda: clock[0])
    pool = KVCachePool(budget_bytes=1000, bytes_per_token=1, idle=IdleRule(tokens=30, seconds=1.0))
    for sid in ("a", "b", "c"):  # used at 100.0, 100.2, 100.4
        pool.acquire(sid, 20).tokens.extend(range(20))
        clock[0] += 0.2
    clock[0] = 101.3  # a and b idle (40 positions > 30), c not yet
    pool.acquire("d", 20).tokens.extend(range(20))
    assert list(pool._sessions) == ["b", "c", "d"] and pool.counters.evictions == 1
    clock[0] = 103.0  # all idle; b is acquired again, so c and d are the idle ones
    pool.acquire("b", 25)
    assert list(pool._sessions) == ["d", "b"] and pool.counters.evictions == 2
    pool.acquire("a", 20)  # a comes back: a re-prefill
    assert pool.counters.reprefills == 1

    keep_all = KVCachePool(budget_bytes=1000, bytes_per_token=1)  # no rule (torch): idle sessions stay
    for sid in ("a", "b", "c"):
        keep_all.acquire(sid, 20).tokens.extend(range(20))
    clock[0] = 200.0
    keep_all.acquire("d", 20)
    assert len(keep_all._sessions) == 4 and keep_all.counters.evictions == 0
    none_idle = KVCachePool(budget_bytes=1000, bytes_per_token=1, idle=IdleRule(tokens=0, seconds=1.0))
    for sid in ("a", "b"):
        none_idle.acquire(sid, 20).tokens.extend(range(20))
    clock[0] = 202.0
    none_idle.acquire("c", 5)
    assert list(none_idle._sessions) == ["c"]


def test_a_growing_session_counts_its_whole_length_against_the_budget(model):
    runner = runner_for(model, budget_tokens=50)
    runner.extend("a", list(range(1, 21)), first=19)  # 20 tokens held by a
    runner.extend("b", list(range(1, 21)), first=19)  # 20 tokens held by b: 40 in all
    runner.extend("b", list(range(1, 41)), first=39)  # b grows to 40: a must go (40 + 20 > 50)
    assert runner.pool.used_bytes() <= runner.pool.budget_bytes
    assert runner.pool.session_count() == 1


def test_sessions_extended_together_stay_within_the_budget(model):
    """One batched pass acquires every session before any grows: each counts what it will reach."""
    per_token = kv_bytes_per_token(model.config, 4)
    runner = CausalLMRunner(model, KVCachePool(50 * per_token, per_token, model.config), batching=True)
    runner.extend("a", list(range(1, 11)), first=9)  # a holds 10
    runner.extend("b", list(range(1, 11)), first=9)  # b holds 10
    runner.extend_batch(
        [
            ExtendItem("a", list(range(1, 31)), 29),  # a will hold 30 ...
            ExtendItem("b", list(range(1, 31)), 29),
        ]
    )  # ... so b's 30 evicts it (60 > 50)
    assert runner.pool.used_bytes() <= runner.pool.budget_bytes
    assert runner.pool.session_count() == 1


def test_one_session_over_the_budget_is_refused_clearly(model):
    runner = runner_for(model, budget_tokens=10)
    with pytest.raises(ResourceExhausted, match="over the cache budget"):
        runner.extend("big", list(range(1, 30)), first=28)


def test_a_failed_forward_drops_the_half_updated_cache(model):
    runner = runner_for(model)
    runner.extend("s", [1, 2, 3, 4], first=3)
    with pytest.raises((IndexError, RuntimeError)):
        runner.extend("s", [1, 2, 3, 4, VOCAB + 5], first=3)  # out-of-range id fails inside the model
    assert runner.pool.session_count() == 0


def test_hidden_rows_grow_in_place_and_truncate_with_the_cache():
    """append_hidden keeps the same rows torch.cat would, without copying the history each time."""
    kv = SessionKV(cache=DynamicCache())
    gen = torch.Generator().manual_seed(0)
    reference = torch.empty(0, 8)
    buffers, last = 0, None  # count reallocations: a freed buffer's address may be reused later
    for step, n in enumerate([5, 1, 1, 3, 1, 70, 2]):
        rows = torch.randn(n, 8, generator=gen)
        kv.tokens += list(range(n))
        kv.append_hidden(rows)
        reference = torch.cat([reference, rows])
        if kv._hidden_store.data_ptr() != last:  # the old one is alive during the copy: never the same address
            buffers, last = buffers + 1, kv._hidden_store.data_ptr()
        assert torch.equal(kv.hidden, reference)
        if step == 3:  # roll back 2 positions: rows go with the cache
            kv.truncate(len(kv.tokens) - 2)
            reference = reference[:-2]
            assert torch.equal(kv.hidden, reference)
    assert buffers == 3  # 64 rows, then 79 (a 70-row jump), then doubled to 158
    half = torch.randn(2, 8).half()
    kv.append_hidden(half)  # appended in the kept rows' dtype
    assert kv.hidden.dtype == torch.float32 and torch.equal(kv.hidden[-2:], half.float())


def test_uncached_counts_what_a_forward_would_compute_and_leaves_the_lru_order(model):
    runner = runner_for(model, 100)
    runner.extend("a", [1, 2, 3, 4], first=3)
    runner.extend("b", [9, 9], first=1)
    pool = runner.pool
    assert pool.uncached("a", [1, 2, 3, 4, 5, 6]) == 2  # two new tokens
    assert pool.uncached("a", [1, 2, 7, 8, 5]) == 3  # diverges after 2: rollback + 3 to compute
    assert pool.uncached("nobody", [1, 2, 3]) == 3
    assert list(pool._sessions) == ["a", "b"]  # a peek, not a use: "a" stays least recent


def test_growing_layers_hold_what_torch_cat_would_and_append_in_place():
    """A session cache's layers (GrowingLayer) give the keys/values DynamicLayer's torch.cat gives, through
    appends of any size and truncations, and reallocate only when their spare capacity runs out."""
    cache, reference = new_session_cache(), DynamicCache()
    kv = SessionKV(cache=cache)
    gen = torch.Generator().manual_seed(0)
    buffers, last = 0, None
    for step, n in enumerate([7, 1, 1, 5, 1, 300, 2, 1]):
        k, v = torch.randn(1, 2, n, 8, generator=gen), torch.randn(1, 2, n, 8, generator=gen)
        keys, values = cache.update(k, v, 0)
        ref_keys, ref_values = reference.update(k, v, 0)
        kv.tokens += list(range(n))
        assert torch.equal(keys, ref_keys) and torch.equal(values, ref_values)
        assert cache.get_seq_length() == reference.get_seq_length() == len(kv.tokens)
        layer = cache.layers[0]
        assert isinstance(layer, GrowingLayer)
        if layer._keys.data_ptr() != last:
            buffers, last = buffers + 1, layer._keys.data_ptr()
        if step == 3:  # a rejected draft: roll back 4 positions
            kv.truncate(len(kv.tokens) - 4)
            reference.layers[0].crop(-4)
            assert cache.get_seq_length() == len(kv.tokens) == 10
            layer, ref = cache.layers[0], reference.layers[0]  # read right after the rollback: the views follow
            assert torch.equal(layer.keys, ref.keys) and torch.equal(layer.values, ref.values)
    assert buffers == 2  # 7 + 256 spare, then one reallocation for the 300-row append
    cache.layers[0].crop(-3)  # transformers' own rollback call works too
    assert cache.get_seq_length() == len(kv.tokens) - 3


def test_pool_sessions_get_growing_layers_and_refuse_other_layer_kinds(model):
    runner = runner_for(model)
    runner.extend("s", [1, 2, 3, 4, 5], first=4)
    kv = runner.pool.acquire("s", 5)
    assert kv.cache.layers and all(isinstance(layer, GrowingLayer) for layer in kv.cache.layers)

    class Sliding(DynamicLayer):
        pass

    kv.cache.layers[0] = Sliding()
    with pytest.raises(UnsupportedCacheError):
        kv.truncate(2)


def test_cpu_attention_never_copies_grouped_heads_and_matches_transformers(model, monkeypatch):
    """The single-session attention (ragged.plain_attention) runs grouped K/V heads as they are, masked verify
    passes included, with the values transformers' SDPA path (repeat_kv) gives."""
    import transformers.integrations.sdpa_attention as hf_sdpa

    from specdec.engine.ragged import plain_attention

    module = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(1)
    for rows, cached in ((1, 40), (5, 40), (9, 300), (6, 0)):
        total = rows + cached
        query = torch.randn(1, 4, rows, 8, generator=gen)
        key, value = torch.randn(1, 2, total, 8, generator=gen), torch.randn(1, 2, total, 8, generator=gen)
        mask = (
            None
            if rows == 1 or cached == 0
            else (torch.arange(total).unsqueeze(0) <= torch.arange(cached, total).unsqueeze(1))[None, None]
        )
        expected, _ = hf_sdpa.sdpa_attention_forward(module, query, key, value, mask, scaling=0.35)
        with monkeypatch.context() as patched:
            patched.setattr(hf_sdpa, "repeat_kv", lambda *_: pytest.fail("grouped K/V heads were copied"))
            got, _ = plain_attention(module, query, key, value, mask, scaling=0.35)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_runner_logits_do_not_depend_on_the_cache_layer_kind(model, monkeypatch):
    """Decode steps and verify passes with rollbacks give the same logits on GrowingLayers as on DynamicLayers."""
    import specdec.engine.torch_cache as torch_cache

    def run(factory):
        monkeypatch.setattr(torch_cache, "new_session_cache", factory)
        runner, ids, out = runner_for(model), list(range(1, 30)), []
        out.append(runner.extend("s", ids, first=len(ids) - 1).logits)
        for step in range(6):
            draft = [(7 * step + j) % VOCAB for j in range(4)]
            out.append(runner.extend("s", ids + draft, first=len(ids) - 1).logits)
            ids = ids + draft[: step % 3] + [step + 1]  # keep part of the draft, roll back the rest
        return out

    grown = run(new_session_cache)
    concatenated = run(lambda config=None: DynamicCache(config=config) if config is not None else DynamicCache())
    for a, b in zip(grown, concatenated):
        assert torch.equal(a, b)


def test_joined_ids_read_as_the_concatenated_list():
    """VerifyInput.ids joins context and draft without copying the context; it reads as the list would."""
    from specdec.engine.types import JoinedIds

    head, tail = list(range(10, 17)), [90, 91, 92]
    joined, whole = JoinedIds(head, tail), head + tail
    assert len(joined) == len(whole) and list(joined) == whole
    for i in range(-len(whole), len(whole)):
        assert joined[i] == whole[i]
    for start in range(-12, 13):
        for stop in (None, *range(-12, 13)):
            assert joined[start:stop] == whole[start:stop], (start, stop)
    assert joined[::2] == whole[::2] and joined[::-1] == whole[::-1]
    with pytest.raises(IndexError):
        joined[len(whole)]
    assert common_prefix_len(whole[:-1] + [0], joined) == len(whole) - 1
