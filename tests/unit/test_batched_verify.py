"""Batched verification: sessions packed into ONE forward pass give each session what it gets alone."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdec.core.sampling import SamplingConfig
from specdec.engine.kvcache import KVCachePool, kv_bytes_per_token
from specdec.engine.runner import ExtendItem
from specdec.engine.target import TargetEngine
from specdec.engine.torch_runner import CausalLMRunner
from specdec.engine.types import VerifyInput
from specdec.errors import InvalidArgument, ResourceExhausted

VOCAB = 96
ATOL = 1e-4  # batched matmuls round differently from single-session ones, nothing more
ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def build(arch: str):
    config_cls, model_cls = ARCHS[arch]
    cfg = config_cls(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = model_cls(cfg).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


@pytest.fixture(scope="module", params=sorted(ARCHS))
def model(request):
    return build(request.param)


def runner_for(model, batching: bool, budget_tokens: int = 100_000) -> CausalLMRunner:
    per_token = kv_bytes_per_token(model.config, 4)
    return CausalLMRunner(model, KVCachePool(budget_tokens * per_token, per_token, model.config), batching=batching)


def random_ids(g: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def test_packed_forward_gives_each_session_its_own_logits_over_rounds_with_rollback(model):
    g = torch.Generator().manual_seed(1)
    batched, alone = runner_for(model, batching=True), runner_for(model, batching=False)
    assert batched.batching and not alone.batching
    contexts = {f"s{i}": random_ids(g, n) for i, n in enumerate([1, 5, 17, 40])}
    for _ in range(4):  # rounds: each extends by a draft, the next keeps a random prefix of it (rollback)
        items = []
        for sid, ctx in contexts.items():
            draft = random_ids(g, int(torch.randint(0, 6, (1,), generator=g)))
            items.append(ExtendItem(sid, ctx + draft, len(ctx) - 1))
        got = batched.extend_batch(items)
        for item, res in zip(items, got):
            ref = alone.extend(item.session_id, item.ids, item.first)
            assert res.batch_size == len(items)
            assert (res.cached_tokens, res.computed_tokens, res.rolled_back) == (
                ref.cached_tokens,
                ref.computed_tokens,
                ref.rolled_back,
            )
            torch.testing.assert_close(res.logits, ref.logits, atol=ATOL, rtol=0)
            keep = int(torch.randint(len(item.ids) - item.first, len(item.ids) + 1, (1,), generator=g))
            contexts[item.session_id] = list(item.ids[:keep]) + random_ids(g, 1)
    assert batched.pool.counters.rolled_back_tokens == alone.pool.counters.rolled_back_tokens > 0


def test_a_batch_holds_each_session_once_and_needs_ragged_attention(model):
    with pytest.raises(ValueError, match="at most once"):
        runner_for(model, batching=True).extend_batch([ExtendItem("a", [1, 2], 1), ExtendItem("a", [1, 3], 1)])
    with pytest.raises(ValueError, match="batches of one"):
        runner_for(model, batching=False).extend_batch([ExtendItem("a", [1, 2], 1), ExtendItem("b", [1, 3], 1)])


SAMPLINGS = [
    SamplingConfig(),
    SamplingConfig(temperature=0.8, top_p=0.9, seed=11),
    SamplingConfig(temperature=1.0, top_k=20, seed=12, repetition_penalty=1.3, presence_penalty=0.5),
]


def inputs_for_round(g: torch.Generator, contexts: dict[str, list[int]], round_index: int) -> list[VerifyInput]:
    return [
        VerifyInput(
            session_id=sid,
            context_ids=list(ctx),
            draft_ids=random_ids(g, 1 + (i + round_index) % 4),
            sampling=SAMPLINGS[i % len(SAMPLINGS)],
            logprobs=2,
        )
        for i, (sid, ctx) in enumerate(contexts.items())
    ]


def test_batched_verify_equals_verify_alone_for_greedy_sampled_and_penalised_sessions(model):
    g = torch.Generator().manual_seed(2)
    batched = TargetEngine(runner_for(model, batching=True), max_context=512, max_k=8)
    alone = TargetEngine(runner_for(model, batching=False), max_context=512, max_k=8)
    contexts = {f"s{i}": random_ids(g, 3 + 7 * i) for i in range(6)}
    for round_index in range(5):
        inputs = inputs_for_round(g, contexts, round_index)
        outs = batched.verify_batch(inputs)
        for inp, out in zip(inputs, outs):
            ref = alone.verify(inp)
            assert (out.result.num_accepted, out.result.next_token, out.result.target_ids) == (
                ref.result.num_accepted,
                ref.result.next_token,
                ref.result.target_ids,
            )
            assert [lp.token_id for lp in out.logprobs] == [lp.token_id for lp in ref.logprobs]
            assert out.stats.batch_size == len(inputs)
            emitted = inp.draft_ids[: out.result.num_accepted] + [out.result.next_token]
            contexts[inp.session_id] = inp.context_ids + emitted


def test_a_bad_item_fails_alone_and_the_others_are_verified(model):
    engine = TargetEngine(runner_for(model, batching=True), max_context=512, max_k=8)
    good = VerifyInput("good", [1, 2, 3], [4, 5], SamplingConfig())
    bad = VerifyInput("bad", [1, 2, 3], [VOCAB + 5], SamplingConfig())
    too_long = VerifyInput("long", [1, 2, 3], list(range(9)), SamplingConfig())
    out = engine.verify_batch([good, bad, too_long])
    assert isinstance(out[1], InvalidArgument) and "draft_ids" in str(out[1])
    assert isinstance(out[2], InvalidArgument) and "max_k" in str(out[2])
    assert out[0].result.num_accepted >= 0 and out[0].stats.batch_size == 1


def test_a_session_over_the_cache_budget_fails_alone(model):
    engine = TargetEngine(runner_for(model, batching=True, budget_tokens=30), max_context=512, max_k=8)
    small = [VerifyInput(f"small{i}", [1, 2, 3, 4], [5], SamplingConfig()) for i in range(2)]
    huge = VerifyInput("huge", list(range(40)), [5], SamplingConfig())
    out = engine.verify_batch([small[0], huge, small[1]])
    assert isinstance(out[1], ResourceExhausted)
    assert all(not isinstance(out[i], Exception) for i in (0, 2))
    assert engine.runner.pool.used_bytes() <= engine.runner.pool.budget_bytes


def test_a_prefill_in_chunks_gives_the_verdict_of_a_whole_prefill_and_counts_all_its_work(model):
    g = torch.Generator().manual_seed(5)
    chunked = TargetEngine(runner_for(model, batching=True), max_context=512, max_k=8)
    whole = TargetEngine(runner_for(model, batching=True), max_context=512, max_k=8)
    for sampling in SAMPLINGS:
        context, draft = random_ids(g, 45), random_ids(g, 3)
        inp = VerifyInput("s", context, draft, sampling, logprobs=2)
        assert chunked.work_tokens(inp) == 48
        left = [chunked.prefill_chunk(inp, 16), chunked.prefill_chunk(inp, 16), chunked.prefill_chunk(inp, 16)]
        assert left == [32, 16, 16]  # the verify itself computes the last 16
        out, ref = chunked.verify(inp), whole.verify(VerifyInput("s", context, draft, sampling, logprobs=2))
        assert (out.result.num_accepted, out.result.next_token, out.result.target_ids) == (
            ref.result.num_accepted,
            ref.result.next_token,
            ref.result.target_ids,
        )
        for a, b in zip(out.logprobs, ref.logprobs):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < ATOL
        assert (out.stats.cached_tokens, out.stats.computed_tokens) == (ref.stats.cached_tokens, 48)
        chunked.runner.pool.release("s")
        whole.runner.pool.release("s")
    with pytest.raises(InvalidArgument):  # a bad call fails at its first chunk already
        chunked.prefill_chunk(VerifyInput("bad", list(range(40)), [VOCAB + 1], SamplingConfig()), 16)


def test_a_prefill_turn_in_a_verify_batch_gives_what_separate_passes_give(model):
    g = torch.Generator().manual_seed(11)
    together = TargetEngine(runner_for(model, batching=True), max_context=512, max_k=8)
    apart = TargetEngine(runner_for(model, batching=True), max_context=512, max_k=8)
    contexts = {f"s{i}": random_ids(g, 5 + 3 * i) for i in range(3)}
    prompt, draft = random_ids(g, 45), random_ids(g, 3)
    turn, turn_ref = (VerifyInput("p", prompt, draft, SamplingConfig(), logprobs=2) for _ in range(2))
    lefts = []
    for round_index in range(3):
        inputs = inputs_for_round(g, contexts, round_index)
        outs, left = together.verify_batch_with_turn(inputs, turn, 16)
        refs, ref_left = apart.verify_batch(inputs), apart.prefill_chunk(turn_ref, 16)
        lefts.append(left)
        assert left == ref_left
        for inp, out, ref in zip(inputs, outs, refs):
            assert (out.result.num_accepted, out.result.next_token, out.result.target_ids) == (
                ref.result.num_accepted,
                ref.result.next_token,
                ref.result.target_ids,
            )
            contexts[inp.session_id] = (
                inp.context_ids + inp.draft_ids[: out.result.num_accepted] + [out.result.next_token]
            )
    assert lefts == [32, 16, 16]  # the third turn found only the verify's own rows left
    out, ref = together.verify(turn), apart.verify(turn_ref)
    assert (out.result.next_token, out.result.target_ids) == (ref.result.next_token, ref.result.target_ids)
    assert out.stats.computed_tokens == 48
    bad = VerifyInput("bad", list(range(40)), [VOCAB + 1], SamplingConfig())
    outs, left = together.verify_batch_with_turn(inputs_for_round(g, contexts, 3), bad, 16)
    assert isinstance(left, InvalidArgument) and not any(isinstance(o, Exception) for o in outs)
