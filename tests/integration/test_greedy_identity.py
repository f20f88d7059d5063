"""Greedy speculative output is token-identical to the target decoding alone.

Tiny random Llama models with SmolLM2's real tokenizer: the draft is a perturbed
copy of the target, so acceptance is partial and every branch of the round runs
(asserted below). The services are the real servicers behind real gRPC on
loopback, with sessions in a real Redis (tests/support.InProcessStack).

Tie rule: a (k+1)-token forward can differ from one-token steps by ~1e-6 in the
logits. A mismatch is accepted only where the target's top-2 logit gap at that
position is below TIE_EPSILON; the test reports how often that happened.
"""

from __future__ import annotations

import pytest

from specdec.core.ngram import NgramProposer
from specdec.v1 import common_pb2, target_pb2
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import divergence, served_pair, target_greedy, tiny_pair_and_reference

pytestmark = pytest.mark.integration

K_VALUES = (1, 2, 3, 5, 8)
BRANCH_PROMPT_STRIDE = 3  # every third prompt x every k: 55 generations still run every branch (asserted)
COMBINED_PROMPTS = IDENTITY_PROMPTS[::2]  # 16 prompts + 4 repeated, twice: both draft kinds run (asserted)
TIE_EPSILON = 1e-4
MAX_TIE_FRACTION = 0.02


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_pair_and_reference(tmp_path_factory.mktemp("tiny"), IDENTITY_PROMPTS)


@pytest.fixture(scope="module")
def stack(tiny, redis_server):
    with served_pair(tiny[0], tiny[1], redis_server.url) as s:
        yield s


def generate(stub, prompt, k, max_new, **extra):
    req = pb.GenerateRequest(prompt=prompt, k=k, max_new_tokens=max_new, trace=True, **extra)
    return stub.Generate(req, timeout=120)


def test_greedy_identity_and_branches(stack, tiny):
    _, _, model = tiny
    channel, stub = stack.stub()
    eos = sorted(stack.deps.eos_ids)
    seen = {
        "bonus": 0,
        "rejected_first": 0,
        "partial": 0,
        "eos_in_draft": 0,
        "length_clipped_round": 0,
        "eos_finish": 0,
    }
    ties, failures, runs = 0, [], 0
    for pi, prompt in enumerate(IDENTITY_PROMPTS[::BRANCH_PROMPT_STRIDE]):
        prompt_ids = stack.tokenizer.encode(prompt)
        for k in K_VALUES:
            max_new = 12 + (pi * 7 + k) % 29
            resp = generate(stub, prompt, k, max_new)
            want = target_greedy(model, prompt_ids, max_new, eos)
            verdict = divergence(model, prompt_ids, list(resp.token_ids), want, tie_epsilon=TIE_EPSILON)
            runs += 1
            ties += verdict == "tie"
            if verdict not in ("", "tie"):
                failures.append(f"{prompt!r} k={k}: {verdict}")
            _count_branches(resp, k, eos, seen)
    channel.close()
    print(f"\n{runs} generations, {ties} near-tie divergences (eps={TIE_EPSILON}), branches: {seen}")
    assert not failures, "\n".join(failures[:10])
    assert ties <= MAX_TIE_FRACTION * runs
    assert all(v > 0 for v in seen.values()), f"some branches never ran: {seen}"


def _count_branches(resp, k_requested, eos, seen) -> None:
    for r in resp.trace:
        k = len(r.draft_ids)
        if k and r.num_accepted == k and r.next_kind == target_pb2.NEXT_KIND_BONUS:
            seen["bonus"] += 1
        if k and r.num_accepted == 0:
            seen["rejected_first"] += 1
        if 0 < r.num_accepted < k:
            seen["partial"] += 1
        if any(t in eos for t in r.draft_ids):
            seen["eos_in_draft"] += 1
    if resp.finish_reason == pb.FINISH_REASON_EOS:
        seen["eos_finish"] += 1
    # max_new_tokens reached inside what would have been a full round: k was clipped to the tokens left.
    last = resp.trace[-1] if resp.trace else None
    if resp.finish_reason == pb.FINISH_REASON_LENGTH and last is not None and last.k < k_requested:
        seen["length_clipped_round"] += 1


def test_multi_turn_continuation_matches_target(stack, tiny):
    _, _, model = tiny
    channel, stub = stack.stub()
    eos = sorted(stack.deps.eos_ids)
    first = generate(stub, "Once upon a time", 3, 10, ignore_eos=True)
    second = generate(stub, " And then", 3, 12, session_id=first.session_id)
    tok = stack.tokenizer
    ids = tok.encode("Once upon a time") + list(first.token_ids) + tok.encode(" And then", add_special_tokens=False)
    want = target_greedy(model, ids, 12, eos)
    channel.close()
    assert divergence(model, ids, list(second.token_ids), want, tie_epsilon=TIE_EPSILON) in ("", "tie")
    assert second.usage.prompt_tokens == len(ids)
    assert second.usage.cached_prompt_tokens == len(ids) - 2


def test_target_only_k0_matches_target(stack, tiny):
    _, _, model = tiny
    channel, stub = stack.stub()
    eos = sorted(stack.deps.eos_ids)
    resp = generate(stub, "The capital of France is", 0, 20)
    channel.close()
    want = target_greedy(model, stack.tokenizer.encode("The capital of France is"), 20, eos)
    assert list(resp.token_ids) == want
    assert resp.stats.draft_tokens == 0 and resp.stats.rounds == len(want)


def test_combined_draft_mixes_lookup_and_model_rounds_and_matches_target(stack, tiny):
    """draft_kind="combined": prompt lookup proposes when the context has a match, the model draft otherwise;
    done by the draft service, or with the lookup in the orchestrator (no hop on a hit; on a miss the draft
    service is asked for kind "model"). Output still equals the target alone."""
    _, _, model = tiny
    channel, stub = stack.stub()
    eos = sorted(stack.deps.eos_ids)
    repeated = [f"{p} {p}" for p in IDENTITY_PROMPTS[:4]]  # the tail occurred before: round 1 has a lookup hit
    prompt_ids = {p: stack.tokenizer.encode(p) for p in COMBINED_PROMPTS + repeated}
    want = {p: target_greedy(model, ids, 40, eos) for p, ids in prompt_ids.items()}  # once for both passes
    try:
        for local in (None, NgramProposer(2, 4)):
            stack.deps.runner.local_ngram = local
            kinds: dict[str, int] = {}
            for prompt in COMBINED_PROMPTS + repeated:
                resp = generate(stub, prompt, 4, 40, draft_kind="combined")
                verdict = divergence(
                    model, prompt_ids[prompt], list(resp.token_ids), want[prompt], tie_epsilon=TIE_EPSILON
                )
                assert verdict in ("", "tie"), f"{prompt!r}: {verdict}"
                for r in resp.trace:
                    kinds[r.draft_kind] = kinds.get(r.draft_kind, 0) + 1
                    assert (r.draft_kind == "") == (len(r.draft_ids) == 0)
                    if local is not None and r.draft_kind:
                        assert (r.draft_replica == "local") == (r.draft_kind == "ngram")
            assert kinds.get("ngram", 0) > 0 and kinds.get("model", 0) > 0, kinds
        sampling = common_pb2.SamplingParams(temperature=0.8, seed=7)
        runs = [generate(stub, repeated[0], 4, 24, draft_kind="combined", sampling=sampling) for _ in range(2)]
        assert list(runs[0].token_ids) == list(runs[1].token_ids)  # seeded per request, whichever draft proposed
    finally:
        stack.deps.runner.local_ngram = None
        channel.close()


def _emitted_by_rounds(resp) -> int:
    """Tokens the trace says the rounds emitted: accepted drafts, plus the target's token when it was emitted."""
    return sum(r.num_accepted + (r.next_kind != target_pb2.NEXT_KIND_UNSPECIFIED) for r in resp.trace)


def test_stats_and_trace_count_only_the_tokens_emitted_before_eos(stack):
    """A draft token accepted after EOS is not emitted, so it is neither accepted nor drafted in the stats and
    the trace: the rounds' emitted tokens sum to completion_tokens and the acceptance rate follows."""
    channel, stub = stack.stub()
    free = generate(stub, IDENTITY_PROMPTS[0], 4, 40, ignore_eos=True)
    completion, offset, pick = list(free.token_ids), 0, None
    for r in free.trace:  # a token accepted mid-run (more accepted after it), not seen earlier
        n = r.num_accepted + (r.next_kind != target_pb2.NEXT_KIND_UNSPECIFIED)
        for j in range(r.num_accepted - 1):
            if completion.index(completion[offset + j]) == offset + j:
                pick = pick or completion[offset + j]
        offset += n
    assert pick is not None, "no round accepted two draft tokens; cannot place an EOS inside an accepted run"
    eos_ids = stack.deps.eos_ids
    stack.deps.eos_ids = frozenset({pick})  # the orchestrator's EOS set: cuts where `pick` is emitted
    try:
        cut = generate(stub, IDENTITY_PROMPTS[0], 4, 40)
    finally:
        stack.deps.eos_ids = eos_ids
        channel.close()
    assert cut.finish_reason == pb.FINISH_REASON_EOS and list(cut.token_ids) == completion[: completion.index(pick) + 1]
    last, uncut = cut.trace[-1], free.trace[len(cut.trace) - 1]  # the same round without the EOS
    assert list(uncut.draft_ids[: len(last.draft_ids)]) == list(last.draft_ids)
    assert uncut.num_accepted > last.num_accepted, "the cut was not inside an accepted run"
    assert last.next_kind == target_pb2.NEXT_KIND_UNSPECIFIED and last.next_token == -1
    assert len(last.draft_ids) == len(last.target_ids) == last.num_accepted  # the positions after EOS dropped
    for resp in (free, cut):
        stats = resp.stats
        assert _emitted_by_rounds(resp) == resp.usage.completion_tokens == len(resp.token_ids)
        assert stats.accepted_tokens == sum(r.num_accepted for r in resp.trace)
        assert stats.acceptance_rate == pytest.approx(stats.accepted_tokens / stats.draft_tokens)
        assert stats.mean_accepted_length == pytest.approx(resp.usage.completion_tokens / stats.rounds)
        assert stats.recovered_tokens + stats.bonus_tokens == sum(
            r.next_kind in (target_pb2.NEXT_KIND_RECOVERED, target_pb2.NEXT_KIND_BONUS) for r in resp.trace
        )
        assert stats.draft_tokens == sum(len(r.draft_ids) for r in resp.trace)
        assert sum(stats.accepted_per_position) == stats.accepted_tokens
