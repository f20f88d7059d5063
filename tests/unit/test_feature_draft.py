"""Feature (EAGLE-style) drafts: training forward == inference, the target's kept hidden states,
the draft's cache and catch-up, the orchestrator's relay, and lossless greedy output."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from orchestrator.features import HiddenRelay
from specdec.core.sampling import SamplingConfig
from specdec.distill.feature_train import unrolled_features
from specdec.engine.feature import FeatureDraft
from specdec.engine.kvcache import KVCachePool, kv_bytes_per_token
from specdec.engine.runner import ExtendItem
from specdec.engine.target import TargetEngine
from specdec.engine.torch_runner import CausalLMRunner
from specdec.engine.types import HiddenRows, ProposeInput, VerifyInput
from specdec.errors import InvalidArgument
from specdec.models.feature_draft import build_feature_draft
from specdec.protocol import hidden_from_proto, hidden_to_proto
from specdec.v1 import common_pb2

VOCAB, HIDDEN = 96, 64
GREEDY = SamplingConfig()


def tiny_target() -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def draft_model(target):
    draft = build_feature_draft(target, head_ids=list(range(0, VOCAB, 2)))  # an FR-Spec head of half the ids
    draft.init_from_target(target)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return draft.eval()


def target_engine(target, batching: bool = False) -> TargetEngine:
    per_token = kv_bytes_per_token(target.config, 4) + 4 * HIDDEN
    runner = CausalLMRunner(
        target, KVCachePool(10_000 * per_token, per_token, target.config), batching=batching, keep_hidden=True
    )
    return TargetEngine(runner, 512, 16, max_hidden_rows=10_000)


def feature_engine(draft) -> FeatureDraft:
    per_token = kv_bytes_per_token(draft.config, 4) + 4 * HIDDEN
    return FeatureDraft(draft, KVCachePool(10_000 * per_token, per_token, draft.config), 512, eos_ids=[])


@pytest.mark.parametrize("layers", [1, 2])
def test_unrolled_training_forward_equals_cached_inference(target, layers):
    """Depth d of the training-time test is exactly draft step d at inference (cache, own predictions)."""
    draft_model = build_feature_draft(target, head_ids=None, layers=layers)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in draft_model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    T = 12
    ids, feats = torch.randint(0, VOCAB, (2, T), generator=g), torch.randn(2, T, HIDDEN, generator=g)
    with torch.no_grad():
        outs = unrolled_features(draft_model, ids, feats, depth=3)
        for r in (0, 4, 8):
            for b in range(2):
                cache = DynamicCache()
                f = draft_model(
                    ids[b : b + 1, 1 : r + 2], feats[b : b + 1, : r + 1], torch.arange(r + 1)[None], cache=cache
                )
                f = f[:, -1:]
                torch.testing.assert_close(f[0, 0], outs[0][b, r], atol=1e-5, rtol=1e-5)
                for d in (2, 3):
                    f = draft_model(ids[b : b + 1, r + d : r + d + 1], f, torch.tensor([[r + d - 1]]), cache=cache)
                    torch.testing.assert_close(f[0, 0], outs[d - 1][b, r], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batching", [False, True])
def test_target_keeps_hidden_states_aligned_with_its_cache(target, batching):
    engine = target_engine(target, batching)
    g = torch.Generator().manual_seed(1)
    contexts = {f"s{i}": torch.randint(0, VOCAB, (n,), generator=g).tolist() for i, n in enumerate([3, 9])}
    for _ in range(3):  # extend by 4, keep 2 of them: the rest is rolled back
        items = [ExtendItem(sid, ctx + [1, 2, 3, 4], len(ctx) - 1) for sid, ctx in contexts.items()]
        results = engine.runner.extend_batch(items) if batching else [engine.runner.extend_batch([i])[0] for i in items]
        for item, res in zip(items, results):
            with torch.no_grad():
                ref = target.model(input_ids=torch.tensor([item.ids])).last_hidden_state[0]
            torch.testing.assert_close(res.hidden, ref, atol=1e-4, rtol=1e-4)
        contexts = {sid: ctx + [1, 2] for sid, ctx in contexts.items()}


@pytest.mark.parametrize("batching", [False, True])
def test_only_sessions_that_ask_keep_hidden_states_and_a_late_ask_recomputes(target, batching):
    """Hidden rows cost a copy every round: kept only for sessions whose calls ask (ExtendItem.hidden). A
    session that asks after rounds without rows recomputes its prefix, so its rows stay aligned."""
    engine = target_engine(target, batching)
    g = torch.Generator().manual_seed(2)
    contexts = {sid: torch.randint(0, VOCAB, (n,), generator=g).tolist() for sid, n in (("asks", 5), ("late", 7))}

    def extend(asking: set[str]) -> dict:
        items = [ExtendItem(sid, ctx, len(ctx) - 1, hidden=sid in asking) for sid, ctx in contexts.items()]
        results = engine.runner.extend_batch(items) if batching else [engine.runner.extend_batch([i])[0] for i in items]
        return {item.session_id: res for item, res in zip(items, results)}

    first = extend({"asks"})
    assert first["asks"].hidden is not None and first["late"].hidden is None
    contexts = {sid: ctx + [1, 2] for sid, ctx in contexts.items()}
    second = extend(set())  # "asks" keeps its rows once it asked
    assert second["asks"].hidden.shape[0] == len(contexts["asks"]) and second["late"].hidden is None
    assert second["late"].cached_tokens > 0
    contexts = {sid: ctx + [3] for sid, ctx in contexts.items()}
    third = extend({"asks", "late"})
    assert third["late"].cached_tokens == 0  # no rows for its cached prefix: computed again
    for sid, res in third.items():
        with torch.no_grad():
            ref = target.model(input_ids=torch.tensor([contexts[sid]])).last_hidden_state[0]
        torch.testing.assert_close(res.hidden, ref, atol=1e-4, rtol=1e-4)


def reference_proposal(draft, target, ctx: list[int], k: int) -> list[int]:
    """Stateless: real features of the whole context, then k steps."""
    with torch.no_grad():
        f = target.model(input_ids=torch.tensor([ctx])).last_hidden_state  # [1, L, H]
        cache = DynamicCache()
        L = len(ctx)
        out = draft(torch.tensor([ctx[1:]]), f[:, : L - 1], torch.arange(L - 1)[None], cache=cache)[:, -1:]
        ids = []
        for i in range(k):
            ids.append(int(draft.full_logits(out[0, 0]).argmax()))
            out = draft(torch.tensor([[ids[-1]]]), out, torch.tensor([[L - 1 + i]]), cache=cache)
    return ids


def speculate(
    target_eng, draft_eng, prompt: list[int], k: int, n_new: int, session: str, lose_at: int = -1
) -> tuple[list[int], list[int]]:
    """Greedy rounds as the orchestrator runs them, hidden states relayed through the protocol.

    Returns (the generated tokens, draft tokens proposed per round)."""
    relay, ids, proposed = HiddenRelay(), list(prompt), []
    while len(ids) - len(prompt) < n_new:
        if len(proposed) == lose_at:
            draft_eng.pool.release(session)  # the draft replica lost the session
        rows = relay.take()
        inp = ProposeInput(
            session, ids, k, GREEDY, target_hidden=hidden_from_proto(rows, HIDDEN) if rows is not None else None
        )
        prop = draft_eng.propose(inp)
        relay.after_propose(prop.target_hidden_from)
        proposed.append(prop.draft_ids)
        if prop.draft_ids:
            assert prop.draft_ids == reference_proposal(draft_eng.model, target_eng.runner.model, ids, k)
        out = target_eng.verify(VerifyInput(session, ids, prop.draft_ids, GREEDY, hidden_from=relay.verify_from()))
        relay.after_verify(hidden_to_proto(out.hidden))
        ids += prop.draft_ids[: out.result.num_accepted] + [out.result.next_token]
    return ids[len(prompt) : len(prompt) + n_new], proposed


def target_alone(target_eng, prompt: list[int], n_new: int, session: str) -> list[int]:
    ids = list(prompt)
    while len(ids) - len(prompt) < n_new:
        ids.append(target_eng.verify(VerifyInput(session, ids, [], GREEDY)).result.next_token)
    return ids[len(prompt) :]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_output_equals_the_target_alone_and_proposals_equal_a_stateless_draft(target, draft_model, k):
    t_eng, d_eng = target_engine(target), feature_engine(draft_model)
    g = torch.Generator().manual_seed(k)
    for n in (1, 6, 20):
        prompt = torch.randint(0, VOCAB, (n,), generator=g).tolist()
        got, proposed = speculate(t_eng, d_eng, prompt, k, 24, f"p{n}")
        assert got == target_alone(t_eng, prompt, 24, f"alone{n}")
        assert proposed[0] == []  # round 1: no target rows yet
        assert all(len(p) == k for p in proposed[1:])  # then a full draft every round


def test_a_draft_that_lost_its_session_catches_up_in_one_round(target, draft_model):
    t_eng, d_eng = target_engine(target), feature_engine(draft_model)
    prompt = list(range(10, 22))
    got, proposed = speculate(t_eng, d_eng, prompt, 3, 30, "lost", lose_at=4)
    assert got == target_alone(t_eng, prompt, 30, "alone")
    assert proposed[4] == [] and all(len(p) == 3 for p in proposed[5:])


def test_proposing_twice_on_the_same_context_gives_the_same_draft(target, draft_model):
    """A retried round (no new rows): the draft recomputes its last real position from the rows it kept."""
    t_eng, d_eng = target_engine(target), feature_engine(draft_model)
    ctx = list(range(5, 19))
    out = t_eng.verify(VerifyInput("r", ctx, [], GREEDY, hidden_from=0))
    ctx = ctx + [out.result.next_token]
    first = d_eng.propose(ProposeInput("r", ctx, 4, GREEDY, target_hidden=out.hidden))
    again = d_eng.propose(ProposeInput("r", ctx, 4, GREEDY))
    assert first.draft_ids == again.draft_ids == reference_proposal(draft_model, target, ctx, 4)
    assert first.target_hidden_from == again.target_hidden_from == len(ctx) - 1


def test_a_draft_missing_rows_asks_for_them_and_proposes_nothing(target, draft_model):
    d_eng = feature_engine(draft_model)
    ctx = list(range(30))
    rows = HiddenRows(10, torch.zeros(19, HIDDEN))  # a gap: the draft holds nothing before 10
    out = d_eng.propose(ProposeInput("gap", ctx, 4, GREEDY, target_hidden=rows))
    assert out.draft_ids == [] and out.target_hidden_from == 0


def test_hidden_rows_round_trip_and_malformed_messages_are_invalid_argument():
    rows = HiddenRows(7, torch.randn(3, HIDDEN))
    msg = hidden_to_proto(rows)
    back = hidden_from_proto(msg, HIDDEN)
    assert back.first_position == 7 and back.rows.shape == (3, HIDDEN)
    torch.testing.assert_close(back.rows, rows.rows.half().float())
    assert hidden_from_proto(common_pb2.HiddenStates(), HIDDEN) is None
    with pytest.raises(InvalidArgument, match="size"):
        hidden_from_proto(msg, HIDDEN * 2)
    bad = common_pb2.HiddenStates()
    bad.CopyFrom(msg)
    bad.data = bad.data[:-2]
    with pytest.raises(InvalidArgument, match="bytes"):
        hidden_from_proto(bad, HIDDEN)


def rows_msg(first: int, n: int) -> common_pb2.HiddenStates:
    return hidden_to_proto(HiddenRows(first, torch.zeros(n, 4)))


def test_relay_merges_contiguous_rows_and_follows_the_draft():
    relay = HiddenRelay()
    assert relay.verify_from() == 0 and relay.take() is None
    relay.after_verify(rows_msg(0, 5))
    assert relay.verify_from() == 5
    relay.after_verify(rows_msg(5, 2))  # a k = 0 round: rows pile up until the next Propose
    merged = relay.take()
    assert (merged.first_position, merged.rows, len(merged.data)) == (0, 7, 7 * 4 * 2)
    relay.after_propose(7)
    assert relay.take() is None and relay.verify_from() == 7
    relay.after_verify(rows_msg(7, 3))
    relay.after_propose(0)  # the draft lost its state: ask from 0 again
    assert relay.take() is None and relay.verify_from() == 0
    relay.after_verify(rows_msg(0, 4))
    relay.after_verify(rows_msg(9, 1))  # a gap: the older rows are useless
    assert relay.take().first_position == 9


def test_relay_stops_asking_while_too_much_is_pending():
    relay = HiddenRelay(max_pending_bytes=100)
    relay.after_verify(rows_msg(0, 20))  # 160 bytes
    assert relay.verify_from() is None
    relay.after_propose(20)
    assert relay.verify_from() == 20


def test_sampled_proposals_report_the_q_they_were_drawn_from_and_repeat_under_a_seed(target, draft_model):
    """Sampling: each draft token lies in the support of the q' sent with it (the accept rule's input),
    q' sums to 1, and a retried round draws the same tokens (per-position generators, no global RNG)."""
    t_eng = target_engine(target)
    cfg = SamplingConfig(temperature=1.3, seed=11, draft_top_n=8)
    ctx = list(range(3, 17))
    out = t_eng.verify(VerifyInput("s", ctx, [], GREEDY, hidden_from=0))
    ctx = ctx + [out.result.next_token]
    proposals = []
    for _ in range(2):
        d_eng = feature_engine(draft_model)  # a fresh replica each time
        proposals.append(d_eng.propose(ProposeInput("s", ctx, 4, cfg, target_hidden=out.hidden)))
    first, again = proposals
    assert first.draft_ids == again.draft_ids and len(first.draft_ids) == 4
    assert [d.probs for d in first.draft_probs] == [d.probs for d in again.draft_probs]
    for token, dist in zip(first.draft_ids, first.draft_probs):
        assert token in dist.token_ids and len(dist.token_ids) <= 8
        assert abs(sum(dist.probs) - 1.0) < 1e-5
    other_seed = SamplingConfig(temperature=1.3, seed=12, draft_top_n=8)  # the draws do depend on the seed
    other = feature_engine(draft_model).propose(ProposeInput("s", ctx, 4, other_seed, target_hidden=out.hidden))
    assert other.draft_ids != first.draft_ids
