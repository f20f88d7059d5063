"""Sampling through the whole stack (orchestrator -> draft -> target over gRPC, Redis sessions)."""

from __future__ import annotations

import math

import grpc
import pytest

from specdec.v1 import common_pb2
from specdec.v1 import orchestrator_pb2 as pb
from tests.prompts import IDENTITY_PROMPTS
from tests.support import tiny_stack

pytestmark = pytest.mark.integration
MAX_NEW = 20
# the seedless request cut off by a 0.3 s deadline: on 2 cores the tiny pair needs ~2.5 s for it, so the cut
# lands mid-generation with most of it left to resume (a machine ~8x faster would finish first and skip)
RESUMED_NEW = 150


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    with tiny_stack(tmp_path_factory.mktemp("tiny"), IDENTITY_PROMPTS, redis_server.url) as s:
        yield s


def gen(stack, prompt="Once upon a time", **sampling):
    channel, stub = stack.stub()
    extra = {k: sampling.pop(k) for k in list(sampling) if k in ("k", "logprobs")}
    req = pb.GenerateRequest(
        prompt=prompt,
        max_new_tokens=MAX_NEW,
        ignore_eos=True,
        sampling=common_pb2.SamplingParams(**sampling),
        **{"k": 3, **extra},
    )
    try:
        return stub.Generate(req, timeout=60)
    finally:
        channel.close()


def test_same_seed_same_tokens_other_seeds_differ(stack):
    a = [list(gen(stack, temperature=0.9, seed=s).token_ids) for s in range(6)]
    b = [list(gen(stack, temperature=0.9, seed=s).token_ids) for s in range(6)]
    assert a == b
    assert len({tuple(x) for x in a}) >= 4


def test_seeded_output_does_not_depend_on_the_replica_cache(stack):
    """A session resumed elsewhere re-derives the same draws: dropping every cache changes nothing."""
    first = list(gen(stack, temperature=0.8, seed=11).token_ids)
    for bundle in (stack.target_bundle, stack.draft_bundle):
        bundle.pool.clear()
    assert list(gen(stack, temperature=0.8, seed=11).token_ids) == first


def test_temperature_to_zero_and_top_k_1_reproduce_greedy(stack):
    greedy = list(gen(stack).token_ids)
    assert list(gen(stack, temperature=1e-5, seed=3).token_ids) == greedy
    assert list(gen(stack, temperature=0.7, top_k=1, seed=3).token_ids) == greedy


def test_sampled_rounds_accept_draft_tokens(stack):
    resp = gen(stack, temperature=0.7, seed=1)
    assert resp.stats.draft_tokens > 0 and resp.stats.accepted_tokens > 0
    assert resp.stats.wire_bytes_per_round > 0


def test_logprobs_of_the_chosen_tokens(stack):
    resp = gen(stack, logprobs=3)
    assert len(resp.logprobs) == len(resp.token_ids)
    for tok, lp in zip(resp.token_ids, resp.logprobs):
        assert lp.token_id == tok and lp.logprob <= 0 and len(lp.top_token_ids) == 3
        assert lp.top_logprobs[0] >= lp.logprob - 1e-5  # greedy: the chosen token is the top one
        assert math.isclose(lp.top_logprobs[0], lp.logprob, abs_tol=1e-4)


@pytest.mark.parametrize("field,value", [("temperature", -1.0), ("top_p", 0.0), ("top_k", -2), ("draft_top_n", 0)])
def test_bad_values_are_invalid_argument_over_grpc(stack, field, value):
    with pytest.raises(grpc.RpcError) as err:
        gen(stack, **{field: value})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()


def test_max_rounds_caps_target_passes(stack):
    channel, stub = stack.stub()
    resp = stub.Generate(
        pb.GenerateRequest(
            prompt="Once upon a time", max_new_tokens=40, ignore_eos=True, k=2, max_rounds=3, trace=True
        ),
        timeout=60,
    )
    channel.close()
    assert resp.stats.rounds == 3 and resp.finish_reason == pb.FINISH_REASON_LENGTH
    assert "".join(r.text for r in resp.trace) == stack.tokenizer.decode(list(resp.token_ids))


def test_adaptive_k_keeps_greedy_output_and_varies_k(stack):
    channel, stub = stack.stub()
    base = pb.GenerateRequest(prompt="The quick brown fox", max_new_tokens=40, ignore_eos=True, k=6, trace=True)
    fixed = stub.Generate(base, timeout=60)
    adaptive_req = pb.GenerateRequest()
    adaptive_req.CopyFrom(base)
    adaptive_req.adaptive_k = True
    adaptive = stub.Generate(adaptive_req, timeout=60)
    channel.close()
    assert list(adaptive.token_ids) == list(fixed.token_ids)
    assert all(0 <= r.k <= 6 for r in adaptive.trace)
    assert adaptive.stats.target_computed_tokens > 0
    assert all(r.target_computed_tokens >= 1 for r in adaptive.trace)


def test_a_resumed_request_keeps_its_server_chosen_seed(stack):
    """No seed given: the server picks one and stores it in the session. A request cut off by its
    deadline and retried with the same request_id continues with that seed, so the result equals
    an uninterrupted run with the stored seed given explicitly."""
    channel, stub = stack.stub()
    req = pb.GenerateRequest(
        prompt="Once upon a time",
        max_new_tokens=RESUMED_NEW,
        ignore_eos=True,
        k=3,
        sampling=common_pb2.SamplingParams(temperature=0.9),
        request_id="seedless-1",
        session_id="seedless-s",
        create_session=True,
    )
    try:
        stub.Generate(req, timeout=0.3)
        pytest.skip("the first attempt finished before its deadline: nothing to resume")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    resumed = stub.Generate(req, timeout=120)
    session = stack.call(stack.deps.store.get("seedless-s"))
    seed = int(session.params["seed"])
    explicit = stub.Generate(
        pb.GenerateRequest(
            prompt="Once upon a time",
            max_new_tokens=RESUMED_NEW,
            ignore_eos=True,
            k=3,
            sampling=common_pb2.SamplingParams(temperature=0.9, seed=seed),
        ),
        timeout=120,
    )
    channel.close()
    assert list(resumed.token_ids) == list(explicit.token_ids)


def test_concurrent_adaptive_sessions_keep_greedy_identity(stack):
    """Four adaptive sessions at once (their rounds batched at the target, k chosen from costs the sessions
    share) produce the tokens of k = 0."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = IDENTITY_PROMPTS[:4]
    plain = [list(gen(stack, prompt=p, k=0).token_ids) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        adaptive_out = list(pool.map(lambda p: gen_adaptive(stack, p), prompts))
    assert [list(r.token_ids) for r in adaptive_out] == plain


def gen_adaptive(stack, prompt: str):
    channel, stub = stack.stub()
    req = pb.GenerateRequest(prompt=prompt, max_new_tokens=MAX_NEW, ignore_eos=True, k=6, adaptive_k=True)
    try:
        return stub.Generate(req, timeout=60)
    finally:
        channel.close()
