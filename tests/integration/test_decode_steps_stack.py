"""Decode steps end to end: real servicers over loopback gRPC, sessions in a real Redis (tests/support.InProcessStack).

A round without a draft asks the target for several tokens in one Verify (VerifyRequest.steps). The tokens are those
of one call per token: greedy equals the target decoding alone, and sampled output with a seed is the same token for
token (randomness is keyed by position), with the same logprobs. On the wire: stepping ends at a stop id, a step
request with a draft is refused, and the target serves fewer calls than the rounds it ran.
"""

from __future__ import annotations

import grpc
import pytest

from specdec.v1 import common_pb2, target_pb2, target_pb2_grpc
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import served_pair, target_greedy, tiny_pair_and_reference

pytestmark = pytest.mark.integration

MAX_NEW = 24
STEPS = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_pair_and_reference(tmp_path_factory.mktemp("tiny"), IDENTITY_PROMPTS)


@pytest.fixture(scope="module")
def stack(tiny, redis_server):
    with served_pair(tiny[0], tiny[1], redis_server.url) as s:
        yield s


def generate(stack, steps: int, prompt: str, **fields) -> pb.GenerateResponse:
    stack.deps.cfg.decode_steps = steps
    channel, stub = stack.stub()
    try:
        return stub.Generate(pb.GenerateRequest(prompt=prompt, k=0, max_new_tokens=MAX_NEW, **fields), timeout=120)
    finally:
        channel.close()


def stream(stack, steps: int, prompt: str, **fields) -> list[pb.GenerateChunk]:
    stack.deps.cfg.decode_steps = steps
    channel, stub = stack.stub()
    try:
        request = pb.GenerateRequest(prompt=prompt, k=0, max_new_tokens=MAX_NEW, **fields)
        return list(stub.GenerateStream(request, timeout=120))
    finally:
        channel.close()


def test_greedy_steps_give_the_targets_own_tokens_in_fewer_calls(stack, tiny):
    model, eos = tiny[2], sorted(stack.deps.eos_ids)
    for prompt in IDENTITY_PROMPTS[:3]:
        chunks = stream(stack, STEPS, prompt, ignore_eos=True, trace=True)
        reply = pb.GenerateResponse(token_ids=[t for c in chunks for t in c.token_ids], stats=chunks[-1].stats)
        reply.trace.extend(r for c in chunks for r in c.rounds)
        calls = sum(1 for c in chunks if c.rounds)  # a chunk per target call, with that call's rounds
        want = target_greedy(model, stack.tokenizer.encode(prompt), MAX_NEW, [-1])  # EOS ignored
        assert list(reply.token_ids) == want
        assert reply.stats.rounds == len(reply.trace) == MAX_NEW and reply.stats.target_passes == MAX_NEW
        assert calls == 1 + -(-(MAX_NEW - 1) // STEPS), calls  # the first token alone, then STEPS a call
        assert [r.index for r in reply.trace] == list(range(MAX_NEW))
        assert eos  # the stack's EOS ids were sent as stop ids (the tiny target rarely emits one)


def test_sampled_steps_draw_the_same_tokens_and_logprobs_as_one_call_per_token(stack):
    for seed in (1, 7, 42):
        sampling = common_pb2.SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
        fields = dict(sampling=sampling, logprobs=2, ignore_eos=True)
        one, stepped = (generate(stack, steps, IDENTITY_PROMPTS[1], **fields) for steps in (1, STEPS))
        assert list(stepped.token_ids) == list(one.token_ids), seed
        assert [lp.token_id for lp in stepped.logprobs] == list(stepped.token_ids)
        assert [lp.logprob for lp in stepped.logprobs] == pytest.approx([lp.logprob for lp in one.logprobs], abs=1e-4)
        assert [list(lp.top_token_ids) for lp in stepped.logprobs] == [list(lp.top_token_ids) for lp in one.logprobs]


def verify(stack, **fields) -> target_pb2.VerifyResponse:
    channel = grpc.insecure_channel(next(iter(stack.deps.runner.target.replicas)))
    try:
        return target_pb2_grpc.TargetStub(channel).Verify(target_pb2.VerifyRequest(**fields), timeout=60)
    finally:
        channel.close()


def test_stepping_stops_after_a_stop_id_and_refuses_a_draft(stack):
    ids = stack.tokenizer.encode(IDENTITY_PROMPTS[0])
    full = verify(stack, session_id="steps-a", context_ids=ids, steps=6)
    tokens = [full.next_token] + [s.token for s in full.steps]
    assert len(tokens) == 6 and all(s.stats.forward_ms > 0 and s.stats.computed_tokens == 1 for s in full.steps)
    stop = tokens[2]
    cut = verify(stack, session_id="steps-b", context_ids=ids, steps=6, stop_ids=[stop])
    got = [cut.next_token] + [s.token for s in cut.steps]
    assert got == tokens[: tokens.index(stop) + 1]
    with pytest.raises(grpc.RpcError) as refused:
        verify(stack, session_id="steps-c", context_ids=ids, draft_ids=[tokens[0]], steps=3)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "steps" in refused.value.details()
